"""memd's side of the catch-up child (`memd.indexing.children.catch_up_child`): its command, one
run to its end, and its report.

The child is spawned through the pipeline's spawner (forked from the zygote when it
runs), but not supervised: it is waited for once, without blocking the event loop, and
not restarted; a failure raises `CatchUpFailedError`, which the pipeline logs, and it
tries again from the same `since` (`memd.indexing.daemon.catch_ups.CATCH_UP_RETRY`).
The report is the child's JSON line, tagged with a run id, read back from the tail of its
log (its stdout) once it exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memd.config import Config
from memd.indexing.children import DONE_EVENT, changed_files
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.settings import Command
from memd.indexing.targets import Endpoint
from memd.layout import ClientLayout

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec, Proc, Spawner

TIMEOUT = 600.0  # a catch-up of every session file with a remote provider can take minutes
POLL = 0.05  # seconds between looks at the child (one waitid each)
_LOG_TAIL = 64 * 1024


class CatchUpFailedError(RuntimeError):
    """The catch-up child exited without reporting (its log says why)."""


def child_spec(command: Command, layout: ClientLayout) -> ChildSpec:
    from memd.supervision import ChildSpec

    return ChildSpec(
        name=f"{layout.client_id}/catch_up",
        argv=command.argv,
        env=dict(command.env),
        cwd=command.cwd,
        log_path=layout.logs_dir / "catch_up.log",
    )


async def run_child(
    config: Config,
    layout: ClientLayout,
    endpoint: Endpoint | None,
    since: float,
    spawner: Spawner | None = None,
    timeout: float = TIMEOUT,
) -> int:
    """`run_plan` for a config and a layout."""
    return await run_plan(ClientPlan.of(config, layout), endpoint, since, spawner, timeout)


async def run_plan(
    plan: ClientPlan,
    endpoint: Endpoint | None,
    since: float,
    spawner: Spawner | None = None,
    timeout: float = TIMEOUT,
) -> int:
    """Run one catch-up child to its end and return the chunks it added.

    Call on the event loop thread: the spawn must come from a thread that lives as long
    as memd (PDEATHSIG, see memd.supervision.procs). Raises CatchUpFailedError when the
    child fails or times out; a cancelled caller kills it. Nothing changed since `since`:
    0 at once, no child."""
    layout = plan.layout
    if not await asyncio.to_thread(changed_files, layout.sessions, since):
        return 0
    if spawner is None:
        from memd.supervision.procs import PopenSpawner

        spawner = PopenSpawner()
    run = uuid.uuid4().hex
    spec = child_spec(plan.catch_up(endpoint, since, run), layout)
    proc = spawner.spawn(spec)
    try:
        code = await _exited(proc, time.monotonic() + timeout)
    finally:
        if proc.poll() is None:
            proc.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await _exited(proc, time.monotonic() + 5.0)
    if code is None:
        raise CatchUpFailedError(f"catch-up of {layout.client_id} took over {timeout:.0f} s")
    report = read_report(layout.logs_dir / "catch_up.log", run) if code == 0 else None
    if report is None:
        raise CatchUpFailedError(
            f"catch-up of {layout.client_id} exited with {code} without a report "
            f"(see {spec.log_path})"
        )
    return int(report.get("chunks", 0))


async def _exited(proc: Proc, deadline: float) -> int | None:
    """The child's exit code, or None at the deadline."""
    while (code := proc.poll()) is None:
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(POLL)
    return code


def read_report(log_path: Path, run: str) -> dict[str, Any] | None:
    """The child's JSON line for `run`, from the log's tail."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - _LOG_TAIL))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b'"event"' not in line:
            continue
        with contextlib.suppress(ValueError):
            report = json.loads(line)
            if isinstance(report, dict) and (report.get("event"), report.get("run")) == (
                DONE_EVENT,
                run,
            ):
                return report
    return None
