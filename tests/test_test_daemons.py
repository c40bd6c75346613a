"""Test daemons die with the test session and keep runtime files in its temp dirs (issue 24,
item 14): a pytest stopped hard once left `memd run` and its children running under
pid 1, with zygote sockets in the user's $XDG_RUNTIME_DIR."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil

from tests.support.daemon import REPO
from tests.support.faults import wait_for

INNER = textwrap.dedent(
    """
    import time
    from pathlib import Path

    from tests.support.daemon import DaemonProcess, base_config, write_config


    def test_runs_until_killed(tmp_path):
        config = base_config(
            tmp_path, clients={{"alice": {{"memory_enabled": True, "mode": "mcp_via_llm"}}}}
        )
        memd = DaemonProcess(write_config(tmp_path / "config.toml", config)).start()
        Path({out!r}).write_text(str(memd.proc.pid))
        time.sleep(600)
    """
)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_killed_test_session_takes_its_daemons_along(tmp_path: Path) -> None:
    out = tmp_path / "memd.pid"
    inner = tmp_path / "inner" / "test_inner.py"
    inner.parent.mkdir()
    inner.write_text(INNER.format(out=str(out)))
    user_runtime = tmp_path / "user-runtime"
    user_runtime.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(user_runtime)}
    base = Path(tempfile.mkdtemp(prefix="memd-t14-", dir="/tmp"))  # AF_UNIX paths are short
    log = open(tmp_path / "inner.log", "wb")  # noqa: SIM115 - the inner session owns it
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly", "-p",
         "no:cacheprovider", "--basetemp", str(base), str(inner)],
        cwd=str(tmp_path / "inner"),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    procs: list[psutil.Process] = []
    try:
        log.close()
        wait_for(lambda: out.exists() or session.poll() is not None, 180, 0.2, what="inner memd")
        assert out.exists(), (tmp_path / "inner.log").read_text()[-3000:]
        pid = int(out.read_text())
        wait_for(lambda: len(_tree(pid)) > 1, 60, 0.2, what="memd's children")
        procs = _tree(pid)
        os.kill(session.pid, signal.SIGKILL)  # no teardown, no atexit: as hard as it gets
        session.wait(10)
        wait_for(lambda: not _alive(procs), 30, 0.2, what="memd and its children gone")
        assert list(user_runtime.iterdir()) == [], "runtime files in the user's XDG_RUNTIME_DIR"
    finally:
        for proc in _alive(procs):
            proc.kill()
        if session.poll() is None:
            session.kill()
        shutil.rmtree(base, ignore_errors=True)
