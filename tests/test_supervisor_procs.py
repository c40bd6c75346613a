"""Supervision of real processes: signals, process groups, PDEATHSIG, pidfiles, logs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from memd.indexing import watcher_ready
from memd.supervision.child import ChildSpec
from memd.supervision.childlogs import redact_argv, rotate_log
from memd.supervision.procs import PopenSpawner, activity, cmdline_matches, reap_leftovers
from memd.supervision.states import ProcessStates
from memd.supervision.supervisor import Supervisor
from tests.support.processes import gone, wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

PY = sys.executable
S = ProcessStates

# Ignores SIGINT, starts a grandchild (same process group) that ignores SIGINT too;
# the grandchild writes its pid to argv[1] (atomically) once its SIG_IGN is in place.
IGNORES_SIGINT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c",
    "import os, pathlib, signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
    "p = pathlib.Path(sys.argv[1] + '.tmp'); p.write_text(str(os.getpid()));"
    "os.replace(p, sys.argv[1]); time.sleep(600)", sys.argv[1]])
time.sleep(600)
"""

# Like memsearch watch: runs until KeyboardInterrupt, then cleans up and exits 0.
STOPS_ON_SIGINT = """
import pathlib, sys, time
out = pathlib.Path(sys.argv[1])
try:
    out.joinpath("up").write_text("up")
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    out.joinpath("clean").write_text("cleaned up")
"""


def kill_recorded(marker: Path) -> None:
    """Safety net for failing runs: kill a grandchild whose pid a test script recorded."""
    try:
        pid = int(marker.read_text())
    except (OSError, ValueError):
        return
    if not gone(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(tick=0.02, poll=0.02)
    yield sup
    asyncio.run(sup.shutdown(timeout=10.0))
    kill_recorded(tmp_path / "grandchild.pid")


def test_child_ignoring_sigint_is_killed_with_its_grandchild(
    tmp_path: Path,
    supervisor: Supervisor,
) -> None:
    marker = tmp_path / "grandchild.pid"
    supervisor.add(
        ChildSpec(
            name="stubborn",
            argv=(PY, "-c", IGNORES_SIGINT, str(marker)),
            startsecs=0.1,
            ready=marker.exists,
            stop_timeout=0.5,
            log_path=tmp_path / "stubborn.log",
        )
    )
    assert asyncio.run(supervisor.wait_ready("stubborn", timeout=30.0))
    grandchild = int(marker.read_text())
    assert asyncio.run(supervisor.stop("stubborn")) is True
    status = supervisor.status()["stubborn"]
    assert status.state == S.STOPPED and status.last_signal == "SIGKILL"
    wait_until(lambda: gone(grandchild), timeout=10.0)


def test_grandchildren_left_behind_by_an_exiting_child_are_killed(
    tmp_path: Path,
    supervisor: Supervisor,
) -> None:
    marker = tmp_path / "grandchild.pid"
    script = IGNORES_SIGINT.replace("time.sleep(600)\n", "time.sleep(0)\n")
    script += "while not __import__('os').path.exists(sys.argv[1]): time.sleep(0.02)\n"
    script += "sys.exit(4)\n"
    supervisor.add(
        ChildSpec(
            name="leaver",
            argv=(PY, "-c", script, str(marker)),
            startsecs=60.0,
            startretries=0,
        )
    )
    wait_until(lambda: supervisor.child("leaver").state == S.FATAL, sup=supervisor)
    assert supervisor.status()["leaver"].last_exit_code == 4
    wait_until(lambda: gone(int(marker.read_text())), timeout=10.0)


def sigint_ignored(pid: int) -> bool:
    """Whether SIGINT is ignored in that process, from /proc/<pid>/status SigIgn."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError("no SigIgn line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_child_of_a_parent_ignoring_sigint_still_stops_on_sigint(
    tmp_path: Path,
    supervisor: Supervisor,
) -> None:
    supervisor.add(
        ChildSpec(
            name="watchlike",
            argv=(PY, "-c", STOPS_ON_SIGINT, str(tmp_path)),
            startsecs=0.1,
            ready=(tmp_path / "up").exists,
            stop_timeout=15.0,
        )
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # like `memd run &` from a script
    try:
        supervisor.step()
        control = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert asyncio.run(supervisor.wait_ready("watchlike", timeout=30.0))
        pid = supervisor.status()["watchlike"].pid
        assert pid is not None
        assert sigint_ignored(control.pid), "control: SIG_IGN survives a plain exec"
        assert not sigint_ignored(pid)
    finally:
        control.kill()
        control.wait()
    assert asyncio.run(supervisor.stop("watchlike")) is True
    status = supervisor.status()["watchlike"]
    assert status.last_exit_code == 0 and status.last_signal is None
    assert (tmp_path / "clean").read_text() == "cleaned up"


LAUNCHER = """
import asyncio, pathlib, sys
from memd.supervision.child import ChildSpec
from memd.supervision.supervisor import Supervisor

async def main():
    sup = Supervisor(tick=0.05)
    sup.add(ChildSpec(name="c", argv=(sys.executable, "-c", "import time; time.sleep(600)"),
                      startsecs=0.1))
    assert await sup.wait_ready("c", 30)
    pathlib.Path(sys.argv[1]).write_text(str(sup.status()["c"].pid))
    await sup.run()

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_children_die_when_the_supervisor_is_sigkilled(tmp_path: Path) -> None:
    out = tmp_path / "child.pid"
    launcher = subprocess.Popen([PY, "-c", LAUNCHER, str(out)])
    child_pid = None
    try:
        wait_until(lambda: out.exists() and out.read_text() != "", timeout=60.0)
        child_pid = int(out.read_text())
        assert not gone(child_pid)
        launcher.kill()
        launcher.wait()
        wait_until(lambda: gone(child_pid), timeout=10.0)
    finally:
        launcher.kill()
        launcher.wait()
        if child_pid is not None and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def write_record(path: Path, proc: psutil.Process, argv: list[str], **overrides: object) -> None:
    record = {
        "pid": proc.pid,
        "create_time": proc.create_time(),
        "argv": argv,
        "name": path.stem,
        "stop_signal": int(signal.SIGINT),
    }
    record.update(overrides)
    path.write_text(json.dumps(record))


def test_reap_leftovers_kills_recorded_children_and_nothing_else(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    # A leftover memd child, started through a #! script like the `memsearch` entry point.
    script = tmp_path / "fake-watch"
    script.write_text(f"#!{PY}\n{STOPS_ON_SIGINT}")
    script.chmod(0o700)
    sup = Supervisor()
    sup.add(
        ChildSpec(
            name="watch",
            argv=(str(script), str(tmp_path)),
            startsecs=0.1,
            ready=(tmp_path / "up").exists,
            pidfile=pids / "watch.pid",
        )
    )
    assert asyncio.run(sup.wait_ready("watch", timeout=30.0))
    leftover = sup.status()["watch"].pid
    assert leftover is not None
    assert json.loads((pids / "watch.pid").read_text())["pid"] == leftover
    # A stubborn leftover that only SIGKILL stops.
    stubborn_marker = tmp_path / "stubborn-grandchild"
    stubborn = subprocess.Popen(
        [PY, "-c", IGNORES_SIGINT, str(stubborn_marker)], start_new_session=True
    )
    wait_until(stubborn_marker.exists)
    write_record(
        pids / "stubborn.pid",
        psutil.Process(stubborn.pid),
        [PY, "-c", IGNORES_SIGINT, str(stubborn_marker)],
    )
    # Unrelated processes whose pids sit in stale pidfiles.
    unrelated = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        other = psutil.Process(unrelated.pid)
        write_record(pids / "other-cmdline.pid", other, ["memsearch", "watch", "/x"])
        write_record(
            pids / "other-time.pid",
            other,
            [PY, "-c", "import time; time.sleep(60)"],
            create_time=other.create_time() - 100.0,
        )
        dead = subprocess.Popen([PY, "-c", "pass"])
        dead.wait()
        (pids / "dead.pid").write_text(
            json.dumps({"pid": dead.pid, "create_time": 1.0, "argv": [PY]})
        )
        (pids / "corrupt.pid").write_text("{not json")

        reaped = reap_leftovers(pids, timeout=1.0)

        assert sorted(reaped) == sorted([leftover, stubborn.pid])
        assert list(pids.iterdir()) == []
        assert unrelated.poll() is None and not gone(unrelated.pid)
        assert (tmp_path / "clean").read_text() == "cleaned up"  # it got SIGINT, not SIGKILL
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
        wait_until(lambda: gone(int(stubborn_marker.read_text())), timeout=10.0)
    finally:
        unrelated.kill()
        unrelated.wait()
        stubborn.kill()
        stubborn.wait()
        kill_recorded(stubborn_marker)
    wait_until(lambda: sup.child("watch").state == S.EXITED, sup=sup)
    asyncio.run(sup.shutdown(timeout=5.0))


def test_cmdline_matching_rules() -> None:
    argv = ["memsearch", "watch", "/m/sessions"]
    assert cmdline_matches(argv, argv)
    assert cmdline_matches(
        argv, ["/venv/bin/python3", "/venv/bin/memsearch", "watch", "/m/sessions"]
    )
    assert not cmdline_matches(
        argv, ["/venv/bin/python3", "/venv/bin/memsearch", "watch", "/other"]
    )
    assert not cmdline_matches(argv, ["/usr/bin/vim", "watch", "/m/sessions"])
    assert not cmdline_matches(argv, ["watch", "/m/sessions"])
    assert not cmdline_matches(argv, [])


def test_secrets_on_the_command_line_stay_out_of_logs() -> None:
    argv = [
        "memsearch",
        "watch",
        "/s",
        "--api-key",
        "sk-1",
        "--milvus-token=t0k",
        "--model",
        "m",
        "--keyfile-free",
    ]
    assert redact_argv(argv) == [
        "memsearch",
        "watch",
        "/s",
        "--api-key",
        "***",
        "--milvus-token=***",
        "--model",
        "m",
        "--keyfile-free",
    ]


def test_failing_child_goes_fatal_with_exit_code_and_log_tail(
    tmp_path: Path,
    supervisor: Supervisor,
) -> None:
    log = tmp_path / "logs" / "bad.log"
    supervisor.add(
        ChildSpec(
            name="bad",
            argv=(PY, "-c", "print('dimension mismatch: 256 != 384'); raise SystemExit(3)"),
            startsecs=5.0,
            startretries=2,
            backoff_start=0.05,
            log_path=log,
        )
    )
    wait_until(lambda: supervisor.child("bad").state == S.FATAL, sup=supervisor)
    status = supervisor.status()["bad"]
    assert status.last_exit_code == 3 and status.restarts == 2
    assert status.log_tail is not None and "dimension mismatch" in status.log_tail
    assert log.read_text().count("--- memd ") == 3
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_missing_program_is_a_spawn_failure(tmp_path: Path, supervisor: Supervisor) -> None:
    supervisor.add(
        ChildSpec(
            name="nope",
            argv=("memd-no-such-program-xyz",),
            startretries=0,
            env={"PATH": str(tmp_path)},
        )
    )
    wait_until(lambda: supervisor.child("nope").state == S.FATAL, sup=supervisor)
    error = supervisor.status()["nope"].last_error
    assert error is not None and "not found" in error


def test_live_log_rotation_keeps_the_child_writing_at_the_new_end(tmp_path: Path) -> None:
    log = tmp_path / "chatty.log"
    spec = ChildSpec(
        name="chatty",
        log_path=log,
        log_max_bytes=2_000,
        log_backups=2,
        argv=(
            PY,
            "-u",
            "-c",
            "import time\nfor i in range(10**6):\n"
            "    print('line', i, 'x' * 40); time.sleep(0.002)",
        ),
    )
    proc = PopenSpawner().spawn(spec)
    try:
        for _ in range(3):
            wait_until(lambda: log.stat().st_size > 2_000)
            proc.housekeep()
        wait_until(lambda: log.stat().st_size > 200)
        head = log.read_bytes()[:50]
        assert b"\0" not in head and head.startswith(b"line "), head
        assert (tmp_path / "chatty.log.1").exists() and (tmp_path / "chatty.log.2").exists()
        assert not (tmp_path / "chatty.log.3").exists()
    finally:
        proc.signal(signal.SIGKILL)
        wait_until(lambda: proc.poll() is not None)


def test_rotate_log_before_a_start_renames(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    for generation in range(5):
        log.write_text(f"gen {generation} " + "y" * 100)
        assert rotate_log(log, max_bytes=50, backups=3, live=False)
        assert not log.exists()
    assert rotate_log(log, max_bytes=50, backups=3, live=False) is False
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["x.log.1", "x.log.2", "x.log.3"]
    assert (tmp_path / "x.log.1").read_text().startswith("gen 4")
    assert (tmp_path / "x.log.3").read_text().startswith("gen 2")


class _EmbeddingStub(BaseHTTPRequestHandler):
    """Stand-in for a remote OpenAI-compatible embedding API: 8-dim hash vectors."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": [b / 255 for b in hashlib.sha256(str(t).encode()).digest()[:8]],
            }
            for i, t in enumerate(texts)
        ]
        out = json.dumps(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def watching(sup: Supervisor, name: str, sessions: Path) -> bool:
    proc = sup.child(name).proc
    return proc is not None and watcher_ready(proc.pid, sessions)


@pytest.mark.slow
def test_real_memsearch_watch_stops_cleanly_on_sigint(
    tmp_path: Path,
    supervisor: Supervisor,
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmbeddingStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "a.md").write_text("# Llamas\n\nLlamas hum when they are curious.\n")
    log = tmp_path / "watch.log"
    memsearch = str(Path(PY).parent / "memsearch")
    supervisor.add(
        ChildSpec(
            name="watch",
            log_path=log,
            startsecs=0.5,
            stop_timeout=30.0,
            argv=(
                memsearch,
                "watch",
                str(sessions),
                "--provider",
                "openai",
                "--model",
                "stub",
                "--base-url",
                f"http://127.0.0.1:{server.server_port}/v1",
                "--api-key",
                "x",
                "--milvus-uri",
                str(tmp_path / "milvus.db"),
            ),
            env={"HOME": str(tmp_path), "PATH": os.environ.get("PATH", os.defpath)},
            # Not its "Watching" line: that comes before watchdog's observer starts, and a
            # SIGINT landing in Observer.start() left daemon threads mid-setup at exit
            # (the likely cause of this test's rare failures). memd's own probe: the
            # inotify watch on sessions/, once the observer really runs.
            ready=lambda: watching(supervisor, "watch", sessions),
        )
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        supervisor.step()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert asyncio.run(supervisor.wait_ready("watch", timeout=120.0)), log.read_text()
        assert asyncio.run(supervisor.stop("watch")) is True
    finally:
        server.shutdown()
        server.server_close()
    status = supervisor.status()["watch"]
    assert (status.last_exit_code, status.last_signal) == (0, None)
    assert "Indexed 1 chunks." in log.read_text()
    assert "Stopping watcher." in log.read_text()  # its KeyboardInterrupt cleanup ran


BUSY_THEN_READY = """
import pathlib, sys, time
out, seconds = pathlib.Path(sys.argv[1]), float(sys.argv[2])
end = time.monotonic() + seconds
with open(str(out) + ".work", "wb") as f:
    while time.monotonic() < end:
        f.write(b"x" * 4096)  # an initial scan: CPU and writes, no readiness yet
        sum(range(20000))
out.write_text("ready")
time.sleep(300)
"""


@pytest.mark.parametrize("busy", [True, False])
def test_a_child_busy_past_ready_timeout_is_not_killed(
    tmp_path: Path, supervisor: Supervisor, busy: bool
) -> None:
    """A real child that works for 3 x ready_timeout before it is ready becomes RUNNING
    unkilled (its CPU time and writes move, `procs.activity`); one that only sleeps as
    long is killed at ready_timeout, as before (issue 24, item 9)."""
    ready = tmp_path / "ready"
    code = BUSY_THEN_READY if busy else "import sys, time; time.sleep(300)"
    supervisor.add(
        ChildSpec(
            name="scan",
            argv=(PY, "-c", code, str(ready), "6"),
            startsecs=0.0,
            ready=ready.exists,
            ready_timeout=2.0,
            startretries=0,
            progress=activity,
            log_path=tmp_path / "scan.log",
        )
    )
    if busy:
        assert asyncio.run(supervisor.wait_ready("scan", timeout=60.0))
        status = supervisor.status()["scan"]
        assert status.state == S.RUNNING and status.restarts == 0, status
    else:
        wait_until(lambda: supervisor.status()["scan"].state == S.FATAL, 30, supervisor)
        assert "not ready after" in (supervisor.status()["scan"].last_error or "")
