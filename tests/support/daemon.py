"""Start a real `memd run` in a subprocess, talk to it over its real socket.

A test daemon dies with the test session however the session ends (issue 24: a pytest
stopped with Ctrl-C or killed left `memd run` and its children under pid 1): it is
started through a launcher that sets PR_SET_PDEATHSIG (Linux), every one still running
at the end of the session is stopped (`stop_all`, from conftest), and its runtime files
(the zygote's and index servers' sockets) go to a private folder of the test run, not to
the user's $XDG_RUNTIME_DIR: a short one under /tmp (made 0700, removed at the session's
end), because a socket path beside the config under xdist's temp folders passed the
108-byte limit of AF_UNIX and the index servers could not listen.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from memd.cli.client import ClientError, MemdClient

REPO = Path(__file__).resolve().parents[2]

# Runs in the child before memd: SIGKILL when the test process goes away (checked once
# after the prctl, for a parent that died in between), then exec memd.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit(70)
os.execv(sys.argv[2], sys.argv[2:])
"""
_RUNNING: list[DaemonProcess] = []
_RUNTIME_DIRS: list[Path] = []  # removed by stop_all at the session's end
_SESSION_RUNTIME = os.environ.get("XDG_RUNTIME_DIR", "")  # the user's, never a daemon's


def die_with_us(argv: list[str]) -> list[str]:
    """argv, started so that it is killed when this (the test) process dies."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def stop_all() -> None:
    """Stop every test daemon still running (the session's end)."""
    while _RUNNING:
        proc = _RUNNING.pop()
        with contextlib.suppress(Exception):
            proc.end(timeout=10)
    while _RUNTIME_DIRS:
        shutil.rmtree(_RUNTIME_DIRS.pop(), ignore_errors=True)


def write_config(path: Path, data: dict[str, Any]) -> Path:
    """Write a config atomically, as an editor that saves by renaming would."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomli_w.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return path


def base_config(tmp: Path, **extra: Any) -> dict[str, Any]:
    """A config whose every path is inside the test's folder."""
    data: dict[str, Any] = {
        "memory_dir": str(tmp / "memory"),
        "socket": str(tmp / "run" / "memd.sock"),
        # Daemons of parallel tests would all want port 8767: the browser's tests turn
        # it on (on port 0) where they need it.
        "ui": {"enabled": False},
    }
    data.update(extra)
    return data


def _runtime_dir(config_path: Path) -> Path:
    """The daemon's $XDG_RUNTIME_DIR: the test's own when it set one (a test of the default
    socket place, or one that plants something there), else a short private folder."""
    chosen = os.environ.get("XDG_RUNTIME_DIR", "")
    if chosen and (chosen != _SESSION_RUNTIME or Path(chosen).is_relative_to(config_path.parent)):
        return Path(chosen)
    runtime = Path(tempfile.mkdtemp(prefix="memd-rt-", dir="/tmp"))  # 0700, short
    _RUNTIME_DIRS.append(runtime)
    return runtime


class DaemonProcess:
    """One `memd run --config PATH` child; `stop()` always reaps it."""

    def __init__(self, config_path: Path, env: dict[str, str] | None = None) -> None:
        self.config_path = config_path
        runtime = _runtime_dir(config_path)
        self.env = {
            **os.environ,
            "HOME": str(config_path.parent / "home"),
            "XDG_RUNTIME_DIR": str(runtime),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = config_path.parent / "memd.log"

    @property
    def socket(self) -> Path:
        from memd.config import socket_for

        return socket_for(self.config_path)[0]

    def start(self, wait: bool = True, timeout: float = 60.0) -> DaemonProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            die_with_us(
                [sys.executable, "-m", "memd.cli", "run", "--config", str(self.config_path)]
            ),
            stdout=log,
            stderr=log,
            env=self.env,
            cwd=str(REPO),
            start_new_session=True,
        )
        log.close()
        _RUNNING.append(self)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"memd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with MemdClient(self.socket, timeout=5) as client:
                    if client.call("daemon.status")["state"] == "running":
                        return
                time.sleep(0.05)
            except ClientError:
                time.sleep(0.05)
        raise TimeoutError(f"memd did not become ready:\n{self.log()}")

    def client(self, timeout: float = 30.0) -> MemdClient:
        client = MemdClient(self.socket, timeout=timeout)
        client.connect()
        return client

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        with self.client() as client:
            return client.call(method, params)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def end(self, timeout: float = 20.0) -> None:
        """Stop at a test's end: SIGTERM, wait for memd's own clean shutdown to finish (its
        "memd.stopped" line: services closed, children stopped, state written), then
        SIGKILL the process. What is skipped is only the interpreter's finalization (1-2 s
        of CPU per daemon), which no test looks at; `stop` waits for it and the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                if b'"memd.stopped"' in log.read():
                    self.proc.kill()
                    break
            time.sleep(0.02)
        self.stop(timeout=max(deadline - time.monotonic(), 1.0))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            raise
