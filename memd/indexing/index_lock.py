"""One memsearch indexing run at a time per client, across processes.

A client's session files are indexed by two processes: its `memsearch watch` (events,
and the initial scan) and memd's catch-up (the files changed while a new watcher was
starting). memsearch indexes a file by reading it, asking the index which chunk ids it
holds for that source, deleting the ones the file no longer has and inserting the new
ones. Two such runs on a file that is growing interleave: one reads the file, the other
inserts chunks of a newer read, the first then inserts chunks of its older read that
the second's stale check already missed. The older chunk stays in the index (and is
recalled) until a later run of that file, which for the last exchange of a finished
session never comes. `bench/recall.py --questions` saw it every run: 10,002 chunks for
the 10,001 the file holds, while catch-up ran beside the watcher.

memsearch's private `_index_file` of `MemSearch` (the one step both the scan and a single file go
through) runs under an exclusive `flock` on the client's lock file (`locked`), in every
process that indexes: the watcher and the catch-up child, which both find its path in
`MEMD_INDEX_LOCK` (`settings.watcher_env`) and install the wrapper at start
(`memd.indexing.engine.index_lock`). A run waits for the other's to end, then reads the
file as it is then. This module patches nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import structlog

from memd.layout import ClientLayout

log = structlog.get_logger()

LOCK_NAME = "index.lock"
ENV = "MEMD_INDEX_LOCK"  # set by memd in the watcher's environment (and the catch-up's)


def lock_path(layout: ClientLayout) -> Path:
    """The client's lock file, in its state folder."""
    return layout.state_dir / LOCK_NAME


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock on `path` (created owner-only) while the block runs.

    The lock only orders runs; a file it cannot open (a folder gone with its client)
    must not stop indexing, so that is logged and the run goes on unlocked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        log.warning("index.lock_unavailable", path=str(path), error=str(exc))
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
