"""What a crashed memd left running: its children, found through their pidfiles.

A pidfile is readable data anyone could have written, so only configured clients' folders
are looked at, only if they pass the trust rule, and only processes whose command line is
what memd starts there are stopped (`started_by_memd`). Used by `Pipelines.start`.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from memd import trust
from memd.config import Config
from memd.indexing.daemon.embedder import is_embedder
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.shared_index import is_shared_server
from memd.indexing.targets import Endpoint
from memd.layout import ClientLayout
from memd.supervision import reap_leftovers

log = structlog.get_logger()


async def reap_memd_wide(memory_dir: Path) -> None:
    """A zygote, shared index server or embedder an earlier memd left behind, if its
    folder passes the trust rule."""
    state_dir = memory_dir / ".memd"
    try:
        trust.check_dir(memory_dir)
        trust.check_dir(state_dir)
    except FileNotFoundError:
        return
    except trust.UntrustedPath as exc:
        log.warning("pipeline.leftovers_not_reaped", dir=str(state_dir), error=str(exc))
        return
    reaped = await asyncio.to_thread(reap_leftovers, state_dir, expected=is_memd_wide)
    if reaped:
        log.warning("pipeline.reaped_leftovers", dir=str(state_dir), pids=reaped)


async def reap_client(config: Config, layout: ClientLayout) -> None:
    """One client's index server and watcher an earlier memd left behind."""
    try:
        trust.check_dir(layout.root)
        trust.check_dir(layout.state_dir)
    except FileNotFoundError:
        return
    except trust.UntrustedPath as exc:
        log.warning("pipeline.leftovers_not_reaped", client=layout.client_id, error=str(exc))
        return
    expected = functools.partial(started_by_memd, config, layout)
    reaped = await asyncio.to_thread(reap_leftovers, layout.state_dir, expected=expected)
    if reaped:
        log.warning("pipeline.reaped_leftovers", dir=str(layout.state_dir), pids=reaped)


def started_by_memd(config: Config, layout: ClientLayout, argv: Sequence[str]) -> bool:
    """Whether `argv` is this client's index server or watcher as memd starts them: the
    interpreter, module and the client's own data folder or sessions/ must all match."""
    plan = ClientPlan.of(config, layout)
    placeholder = Endpoint("", "")  # argv[:5] never names it
    commands = [plan.watcher(placeholder).argv]
    if plan.index_server is not None:
        commands.append(plan.index_server.argv)
    return any(list(argv[:5]) == list(command[:5]) for command in commands)


def is_zygote(argv: Sequence[str]) -> bool:
    """Whether `argv` is a zygote as memd starts it (interpreter and module)."""
    return list(argv[:3]) == [sys.executable, "-m", "memd.supervision.zygote"]


def is_memd_wide(argv: Sequence[str]) -> bool:
    """Whether `argv` is one of memd's children not tied to a client (`<memory_dir>/.memd/`)."""
    return is_zygote(argv) or is_shared_server(argv) or is_embedder(argv)
