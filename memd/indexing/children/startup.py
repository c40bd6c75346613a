"""The one start-up routine of memd's child programs (index server, shared index server,
watch wrapper, catch-up child).

Each child, first thing: reads its arguments, tunes the heap (before gRPC's or the
watcher's threads start: memd/heap.py), sets up memd's log lines (except the watcher,
whose log is memsearch's own), and prepares the engine for its role
(`memd.indexing.engine`: versions checked against the pins, patches applied in their
order, each proven). An engine that is not the pinned one, or a patch whose target
moved, ends the child at once with one log line naming the cause and exit code
`EXIT_ENGINE`: it exits while starting every time, so supervision marks it FATAL and
`memd status` shows that line, instead of serving with half its patches.

`stop_event` is the long-running children's SIGINT/SIGTERM handling: the handlers only
set an event the main thread waits on.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable

import structlog

from memd.indexing import engine

log = structlog.get_logger()

EXIT_ENGINE = 78  # EX_CONFIG (sysexits.h): the installed engine is not the one pinned

PREPARE: dict[str, Callable[[], None]] = {
    engine.INDEX_SERVER: engine.prepare_index_server,
    engine.WATCHER: engine.prepare_watcher,
    engine.CATCH_UP: engine.prepare_catch_up,
}


def start(
    role: str,
    parser: argparse.ArgumentParser | None = None,
    argv: list[str] | None = None,
    *,
    memd_logging: bool = True,
) -> argparse.Namespace:
    """Parse `argv` with `parser` (none: the child parses its own), tune the heap, set up
    logging, prepare the engine for `role`; SystemExit(EXIT_ENGINE) when it cannot be."""
    args = parser.parse_args(argv) if parser is not None else argparse.Namespace()
    from memd import heap
    from memd.logs import configure_logging

    heap.tune()
    if memd_logging:
        configure_logging()
    prepare = PREPARE.get(role)  # the embedder uses no engine: nothing to prepare
    try:
        if prepare is not None:
            prepare()
    except engine.EngineMismatch as exc:
        log.error(
            "engine.version_mismatch",
            role=role,
            package=exc.package,
            found=exc.found,
            expected=exc.expected,
            error=str(exc),
        )
        raise SystemExit(EXIT_ENGINE) from None
    except engine.PatchError as exc:
        log.error("engine.patch_failed", role=role, error=str(exc))
        raise SystemExit(EXIT_ENGINE) from None
    return args


def stop_event() -> threading.Event:
    """An event set by SIGINT or SIGTERM (the handlers do nothing else)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
