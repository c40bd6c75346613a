"""memd's side of the zygote: a Spawner that forks children from it, or spawns them plainly.

`ZygoteSpawner` plugs in where `PopenSpawner` did; the state machine in `child` does not
know which way a child was started. A `python -m MODULE` command whose module the zygote
preloaded is forked by the zygote (`memd.supervision.zygote`); anything else, and every
command while the zygote is not RUNNING (starting, restarting after a crash, FATAL,
disabled by the setting, or refused by the platform), is spawned the plain way. The fall
back is logged once per outage, not once per child.

A forked child is memd's own child (memd is a PR_SET_CHILD_SUBREAPER, see the zygote's
docstring), so `ForkedProc` waits for it with waitid/waitpid exactly as `PopenProc` waits
for a Popen: exit codes, signals, group kills and pidfiles are unchanged. Its pidfile
also records the process title the child sets, which `reap_leftovers` compares instead of
the argv (a forked child has the zygote's argv under its title).

A spawn blocks the event loop (the Spawner seam is synchronous) until the zygote reports
the pid: two forks, no child start-up on that path, and REQUEST_TIMEOUT at most, after
which the child is spawned plainly and the half-made one exits unacknowledged.

Being a subreaper, memd also inherits orphans of its children's process trees; zombies
among them that no Proc owns are reaped every few seconds (`reap_strays`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import structlog

from memd.supervision.zygote import MAX_MESSAGE, forkable_module, zygote_env

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec, Proc

from memd.supervision import childlogs, procs

log = structlog.get_logger()

ZYGOTE_NAME = "zygote"
PR_SET_CHILD_SUBREAPER = 36
REQUEST_TIMEOUT = 3.0  # the event loop waits this long at most, then spawns plainly
STRAY_EVERY = 5.0  # seconds between looks for orphaned zombies


class ZygoteUnavailable(RuntimeError):
    """The zygote did not answer or refused; the spawn falls back to a plain one."""


def become_subreaper() -> bool:
    """Make memd the reaper of orphans in its process tree (Linux >= 3.4)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def zygote_spec(
    socket_path: Path,
    log_path: Path | None,
    pidfile: Path | None,
    modules: Sequence[str],
    home: Path | None = None,
    preload: Sequence[str] = (),
) -> ChildSpec:
    """The supervised zygote itself (spawned plainly, never by itself): it forks
    `python -m` of `modules` after importing `preload` and them."""
    from memd.supervision.child import ChildSpec

    argv = [
        sys.executable,
        "-m",
        "memd.supervision.zygote",
        "--socket",
        str(socket_path),
        "--parent",
        str(os.getpid()),
    ]
    for module in modules:
        argv += ["--module", module]
    for module in preload:
        argv += ["--preload", module]
    env = zygote_env()
    if home is not None:  # memsearch reads ~/.memsearch/config.toml at import time
        env["HOME"] = str(home)
    return ChildSpec(
        name=ZYGOTE_NAME,
        argv=tuple(argv),
        env=env,
        log_path=log_path,
        pidfile=pidfile,
        startsecs=0.2,
        stop_signal=signal.SIGTERM,
        stop_timeout=5.0,
        ready=lambda: _answers(socket_path),
    )


def _answers(socket_path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(0.5)
            sock.connect(str(socket_path))
            sock.sendall(b'{"op": "ping"}')
            return bool(json.loads(sock.recv(MAX_MESSAGE)).get("ok"))
    except (OSError, ValueError):
        return False


class ZygoteSpawner:
    """Spawner: fork from the zygote when it is RUNNING, else spawn plainly."""

    def __init__(
        self,
        socket_path: Path | None = None,
        *,
        enabled: bool = True,
        modules: Sequence[str] = (),
        fallback: procs.PopenSpawner | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.modules = tuple(modules)
        self.fallback = fallback or procs.PopenSpawner()
        self.zygote_ready: Callable[[], bool] = lambda: False  # set by the owner
        self.enabled = False
        self._conn: socket.socket | None = None
        self._down_logged = False
        self._tracked: set[int] = set()
        self._next_stray_look = 0.0
        self.forked = 0
        self.plain = 0
        if socket_path is not None:
            self.use(socket_path, enabled=enabled)

    def use(self, socket_path: Path, *, enabled: bool = True) -> bool:
        """Fork from the zygote serving socket_path from now on (once it is RUNNING);
        False, logged once, when the setting or the platform says plain spawn."""
        self.socket_path = socket_path
        self.enabled = self._subreaper(enabled)
        return self.enabled

    @staticmethod
    def _subreaper(enabled: bool) -> bool:
        if not enabled:
            log.info("zygote.disabled", reason="supervision.zygote = false", spawn="plain")
            return False
        if become_subreaper():
            return True
        log.warning(
            "zygote.unsupported", reason="memd cannot be a child subreaper here", spawn="plain"
        )
        return False

    def status(self) -> dict[str, Any]:
        """For daemon.status: whether children are forked, and how many were each way."""
        return {"enabled": self.enabled, "forked": self.forked, "plain": self.plain}

    # -- the Spawner protocol ---------------------------------------------------------

    def spawn(self, spec: ChildSpec) -> Proc:
        proc: Proc | None = None
        if self.enabled and spec.name != ZYGOTE_NAME and forkable_module(spec.argv, self.modules):
            proc = self._try_fork(spec)
        if proc is None:
            proc = self.fallback.spawn(spec)
            self.plain += 1
        self._tracked.add(proc.pid)
        return proc

    def log_tail(self, spec: ChildSpec) -> str:
        return self.fallback.log_tail(spec)

    # -- forking ------------------------------------------------------------------------

    def _try_fork(self, spec: ChildSpec) -> ForkedProc | None:
        if not self.zygote_ready():
            self._fall_back("zygote not running")
            return None
        try:
            pid = self._request(spec)
        except ZygoteUnavailable as exc:
            self._fall_back(str(exc))
            return None
        if self._down_logged:
            log.info("zygote.back", spawn="forked")
            self._down_logged = False
        self.forked += 1
        proc = ForkedProc(pid, spec, self)
        if spec.pidfile is not None:
            proc.write_pidfile()
        return proc

    def _fall_back(self, why: str) -> None:
        if not self._down_logged:
            log.warning("zygote.unavailable", reason=why, spawn="plain until it is back")
            self._down_logged = True

    def _request(self, spec: ChildSpec) -> int:
        env = procs.child_env(spec.env)
        message = json.dumps(
            {
                "op": "spawn",
                "argv": list(spec.argv),
                "env": env,
                "cwd": str(spec.cwd) if spec.cwd is not None else procs.TRUSTED_CWD,
                "parent": os.getpid(),
            }
        ).encode()
        out = childlogs.open_log(spec)
        fds = [out] if out != procs.subprocess.DEVNULL else []
        try:
            answer = self._exchange(message, fds)
        finally:
            for fd in fds:
                os.close(fd)
        if not answer.get("ok") or not isinstance(answer.get("pid"), int):
            raise ZygoteUnavailable(str(answer.get("error") or "zygote closed the connection"))
        return int(answer["pid"])

    def _exchange(self, message: bytes, fds: list[int]) -> dict[str, Any]:
        """Send and read the answer; a kept connection to a zygote that has been
        restarted since fails at once, so one retry on a new connection follows. (A
        zygote that died mid-request never lets its half-made child run.)"""
        for attempt in (1, 2):
            reused = self._conn is not None
            try:
                conn = self._connection()
                socket.send_fds(conn, [message], fds)
                answer = json.loads(conn.recv(MAX_MESSAGE) or b"{}")
                if isinstance(answer, dict) and isinstance(answer.get("pid"), int):
                    conn.sendall(json.dumps({"ack": answer["pid"]}).encode())
            except (OSError, ValueError) as exc:
                self._disconnect()
                if reused and attempt == 1:
                    continue
                raise ZygoteUnavailable(f"zygote did not answer: {exc}") from exc
            if not answer:  # EOF: the zygote went away after reading
                self._disconnect()
                if reused and attempt == 1:
                    continue
            return answer if isinstance(answer, dict) else {}
        return {}

    def _connection(self) -> socket.socket:
        if self._conn is None:
            if self.socket_path is None:
                raise OSError("no zygote socket configured")
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.settimeout(REQUEST_TIMEOUT)
            try:
                conn.connect(str(self.socket_path))
            except OSError:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._disconnect()

    # -- orphans --------------------------------------------------------------------------

    def maybe_reap_strays(self) -> None:
        now = time.monotonic()
        if now >= self._next_stray_look:
            self._next_stray_look = now + STRAY_EVERY
            self.reap_strays()

    def reap_strays(self) -> list[int]:
        """Reap zombie children no Proc owns (orphans of a child's process tree that
        came to memd as the subreaper). Children in memd's own session are left alone:
        they are memd's own subprocesses, whose owners wait for them."""
        children = _child_pids()
        self._tracked &= children
        my_sid = os.getsid(0)
        reaped = []
        for pid in children - self._tracked:
            try:
                if _state(pid) != "Z" or os.getsid(pid) == my_sid:
                    continue
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
            except (OSError, ChildProcessError):
                continue
        if reaped:
            log.info("zygote.strays_reaped", pids=reaped)
        return reaped


def _child_pids() -> set[int]:
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as f:
                pids.update(int(p) for p in f.read().split())
        return pids
    except OSError:
        with contextlib.suppress(psutil.Error):
            pids = {p.pid for p in psutil.Process().children()}
        return pids


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        return f.read().rpartition(")")[2].split()[0]


class ForkedProc(procs.PopenProc):
    """A child the zygote forked; memd is its parent, so it is waited for directly."""

    def __init__(self, pid: int, spec: ChildSpec, spawner: ZygoteSpawner) -> None:
        self._spec = spec
        self._spawner = spawner
        self.pid = pid
        self.returncode: int | None = None
        try:
            self.create_time: float | None = psutil.Process(pid).create_time()
        except psutil.Error:
            self.create_time = None

    def poll(self) -> int | None:
        """As PopenProc.poll: look without reaping, kill the group's rest, then reap."""
        self._spawner.maybe_reap_strays()
        if self.returncode is not None:
            return self.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._lost()
        if info is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return self._lost()
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def _lost(self) -> int:
        """Not our child (memd lost its subreaper role?): gone, status unknown."""
        log.error("zygote.child_lost", pid=self.pid, reason="not memd's child: exit status lost")
        self.returncode = 255
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def write_pidfile(self) -> None:
        """The record `reap_leftovers` checks; `title` is the command line /proc shows."""
        assert self._spec.pidfile is not None
        record: dict[str, Any] = {
            "pid": self.pid,
            "create_time": self.create_time,
            "argv": list(self._spec.argv),
            "title": procs.process_title(self._spec.argv),
            "name": self._spec.name,
            "stop_signal": int(self._spec.stop_signal),
            "memd_pid": os.getpid(),
            "forked": True,
        }
        try:
            procs._write_atomic(self._spec.pidfile, json.dumps(record))
        except OSError as exc:
            log.warning("child.pidfile_failed", name=self._spec.name, pid=self.pid, error=str(exc))
