"""A catch-up does not hold up a restarted watcher (issue 29: replacement time).

The catch-up child takes the client's index lock file by file, as the watcher's start-up
scan does; a watcher killed while a catch-up ran waited for it. Now the catch-up is
abandoned (its child killed) once one of the client's children leaves RUNNING: the
replacement's own scan indexes what changed, and a catch-up from the same `since`
follows its start, so nothing is missed.
"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

import psutil
import pytest

from memd.indexing.index_lock import lock_path
from memd.layout import ClientLayout
from tests.test_pipeline_daemon import child, found, record, running, wait_for

pytestmark = pytest.mark.slow

CLIENTS = {"alpha": {"memory_enabled": True, "mode": "mcp_via_llm"}}


def catch_up_children(memd_pid: int) -> list[psutil.Process]:
    """memd's catch-up children (forked from the zygote: re-parented to memd)."""
    out = []
    for proc in psutil.Process(memd_pid).children(recursive=True):
        try:
            if " -m memd.indexing.children.catch_up_child" in " ".join(proc.cmdline()):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def test_a_watcher_killed_during_a_catch_up_ends_the_catch_up_and_misses_nothing(
    config_file, daemon_factory, tmp_path: Path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    assert memd.proc is not None
    wait_for(lambda: running(memd, "alpha"))
    record(memd, "alpha", "Which train goes to Lyon?", "The 8:14 TGV goes to Lyon.")
    wait_for(lambda: found(memd, "alpha", "train to Lyon", "8:14 TGV"))
    wait_for(lambda: not catch_up_children(memd.proc.pid))  # any start-up catch-up is over

    lock = lock_path(ClientLayout(tmp_path / "memory", "alpha"))
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # every indexing run of alpha now waits
        record(memd, "alpha", "Where is the cabin key?", "The cabin key is under the heron.")
        # A restart of the index server: once it is back, memd starts a catch-up, which
        # blocks on the lock while every child of alpha is RUNNING.
        index = child(memd, "alpha", "index_server")
        os.kill(index["pid"], signal.SIGKILL)
        stuck = wait_for(lambda: catch_up_children(memd.proc.pid))
        assert running(memd, "alpha")
        os.kill(child(memd, "alpha", "watcher")["pid"], signal.SIGKILL)
        # The catch-up child goes although the lock is still held: it was abandoned.
        psutil.wait_procs(stuck, timeout=30)
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in stuck)
    finally:
        os.close(fd)
    wait_for(lambda: running(memd, "alpha"))
    wait_for(lambda: found(memd, "alpha", "cabin key", "under the heron"))
    assert "pipeline.catch_up_abandoned" in memd.log()
