"""A child's environment (memd.supervision.procs.child_env) as the spawned process sees it."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from memd.supervision.child import ChildSpec
from memd.supervision.procs import PopenSpawner
from tests.support.processes import wait_until

PY = sys.executable


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/<pid>/environ")
def test_a_plainly_spawned_index_server_gets_one_blas_thread(tmp_path: Path) -> None:
    """The zygote's forks inherit OPENBLAS_NUM_THREADS=1 from it; a child spawned plainly
    (zygote off, or not up yet) with an index server's environment must have it too: with
    a BLAS thread per core its dense search took ~16 ms instead of ~2.5 ms."""
    from memd.indexing.daemon.plan import server_env

    spec = ChildSpec(name="index", argv=(PY, "-c", "import time; time.sleep(60)"), env=server_env())
    proc = PopenSpawner().spawn(spec)
    try:
        wait_until(lambda: b"time.sleep(60)" in _proc_file(proc.pid, "cmdline"))  # exec'd
        assert b"OPENBLAS_NUM_THREADS=1" in _proc_file(proc.pid, "environ").split(b"\0")
    finally:
        proc.signal(signal.SIGKILL)
        wait_until(lambda: proc.poll() is not None)


def _proc_file(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""
