"""The zygote: one process that imports what memd's children run, then forks them on request.

Started with `python -m memd.supervision.zygote --socket PATH --parent PID --module M ...
--preload P ...` as a supervised child of memd (plain spawn, through the trampoline of
`procs`). It imports what the children need once (for memd's index servers and watchers,
the list in `memd.indexing.daemon.zygote`: memsearch, pymilvus, Milvus Lite, 5-11 s of CPU and
~200 MB per child otherwise), calls `gc.collect(); gc.freeze()` so the collector of a
forked child does not touch (and copy) the inherited objects, and then serves a Unix
socket. Each request names a `python -m MODULE ARGS...` command, its environment and
working directory, with the child's log fd attached (SCM_RIGHTS); the zygote forks, the
fork runs the module as `__main__` and never returns to the zygote's loop.

Why a forked child ends up memd's own child, not the zygote's
--------------------------------------------------------------
memd marks itself PR_SET_CHILD_SUBREAPER. The zygote forks an intermediate that forks the
real child and exits at once; the orphan is re-parented to the nearest subreaper, memd.
So memd waits for it like for any child it spawned (exit codes and signals as today), a
kill -9 of the zygote leaves running children alone, and the child's PR_SET_PDEATHSIG
(set once it sees memd as its parent) fires when memd dies. The child starts its own
session (pgid == pid) like a plain spawn, and waits for the zygote's "go", which comes
only once memd has acknowledged the pid: a child memd never took on (it gave up waiting,
or the zygote died in between) exits instead of running unsupervised.

The zygote itself starts no threads, so forking it is safe: OpenBLAS gets one thread and
Arrow's jemalloc no background thread (OPENBLAS_NUM_THREADS, JE_ARROW_MALLOC_CONF in its
environment, see `zygote_env`); it reports its thread count when ready. Once its children
have started, it has the kernel reclaim the library pages its imports touched and no
child maps (`memd.supervision.zygote_pageout`: ~40 MB of pyarrow, pandas, faiss...).

Protocol (SOCK_SEQPACKET, one JSON object per message):
    {"op": "ping"}                                   -> {"ok": true, "pid": ...}
    {"op": "spawn", "argv": [...], "env": {...}, "cwd": "...", "parent": PID} + [log fd]
                                                     -> {"ok": true, "pid": N}
                                                      | {"ok": false, "error": "..."}
    then, after "ok", memd's {"ack": N}: only then does the child run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memd.supervision import zygote_child
from memd.supervision.zygote_pageout import PAGE_OUT_DELAY, PageOut, pidfd

MAX_MESSAGE = 1 << 20
SPAWN_TIMEOUT = 10.0  # seconds for the intermediate to report its child
PARENT_LOOK = 1.0  # seconds between looks at memd where no pidfd tells of its exit
ACK_TIMEOUT = 5.0  # seconds for memd to confirm it took a child on


def zygote_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The zygote's environment: memd's, with the native thread pools off (see above)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    env["OPENBLAS_NUM_THREADS"] = "1"
    env["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return env


def forkable_module(
    argv: Sequence[str], modules: Sequence[str], executable: str = sys.executable
) -> str | None:
    """The module of a `python -m MODULE ...` command the zygote can fork, else None."""
    if len(argv) >= 3 and argv[0] == executable and argv[1] == "-m" and argv[2] in modules:
        return argv[2]
    return None


def preload(modules: Sequence[str], forkable: Sequence[str]) -> list[str]:
    """Import everything once and run each forkable module's `zygote_preload()` (what it
    imports lazily); returns what failed (the child imports it again and shows why)."""
    failed = []
    for name in (*modules, *forkable):
        try:
            module = importlib.import_module(name)
            if name in forkable and callable(getattr(module, "zygote_preload", None)):
                module.zygote_preload()
        except Exception as exc:
            failed.append(f"{name}: {exc}")
    gc.collect()
    gc.freeze()
    return failed


class _Stopped(Exception):
    """SIGINT or SIGTERM came while the zygote waited: it stops serving."""


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


class Zygote:
    """The serving loop: one connection at a time (memd's), one request at a time."""

    def __init__(
        self,
        socket_path: Path,
        parent: int,
        modules: Sequence[str],
        page_out_delay: float = PAGE_OUT_DELAY,
    ) -> None:
        self.socket_path = socket_path
        self.parent = parent
        self.modules = frozenset(modules)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._stop = False
        self._waiting = False  # blocked in `_wait_readable`: a stop signal ends the wait
        self.pages = PageOut(page_out_delay)  # library pages no child maps, given back
        self._parent_fd = pidfd(parent)  # readable once memd is gone

    def bind(self) -> None:
        self.socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        self.listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self.listener.listen(4)

    def serve(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_stop)
        try:
            while not self._stop:
                if self._wait_readable(self.listener.fileno()):
                    conn, _ = self.listener.accept()
                    with conn:
                        self._serve_connection(conn)
                else:
                    self._idle()
                if os.getppid() != self.parent:
                    return  # memd is gone (PDEATHSIG should have come first)
        except _Stopped:
            pass
        finally:
            self.pages.close()
            if self._parent_fd is not None:
                os.close(self._parent_fd)
            self.listener.close()
            self.socket_path.unlink(missing_ok=True)

    def _on_stop(self, *_: Any) -> None:
        self._stop = True
        if self._waiting:  # Python retries an interrupted select(): end the wait here
            raise _Stopped

    def _wait_readable(self, fd: int) -> bool:
        """Until `fd` is readable (True) or something else wants a look (False): a forked
        child's exit, memd's exit, the page-out's time; no timer (it looked every second:
        1 wake-up/s of the idle tree), but every PARENT_LOOK s where pidfds are missing."""
        others = self.pages.fds()
        timeout = self.pages.wait()
        if self._parent_fd is not None:
            others.append(self._parent_fd)
        else:
            timeout = PARENT_LOOK if timeout is None else min(timeout, PARENT_LOOK)
        if self._stop:
            raise _Stopped
        self._waiting = True
        try:
            ready, _, _ = select.select([fd, *others], [], [], timeout)
        finally:
            self._waiting = False
        return fd in ready

    def _idle(self) -> None:
        """Something other than a request woke the zygote: give back library pages when
        it is time (`PageOut.tick` also notices exited children)."""
        if self.pages.tick():
            print(json.dumps({"event": "zygote_paged_out", "times": self.pages.done}), flush=True)

    def _serve_connection(self, conn: socket.socket) -> None:
        if not _same_user(conn):
            return
        conn.settimeout(1.0)
        while not self._stop:
            if not self._wait_readable(conn.fileno()):
                if os.getppid() != self.parent:
                    return
                self._idle()
                continue
            try:
                data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 4)
            except (InterruptedError, ConnectionError, OSError):
                return
            if not data:
                return
            try:
                self._answer(conn, data, fds)
            except OSError:  # the asker gave up waiting (a probe's timeout): not fatal
                return
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _answer(self, conn: socket.socket, data: bytes, fds: list[int]) -> None:
        try:
            request = json.loads(data)
            op = request.get("op")
        except (ValueError, AttributeError):
            _send(conn, {"ok": False, "error": "request is not a JSON object"})
            return
        if op == "ping":
            _send(conn, {"ok": True, "pid": os.getpid(), "threads": thread_count()})
        elif op == "spawn":
            self._spawn(conn, request, fds[0] if fds else None)
        else:
            _send(conn, {"ok": False, "error": f"unknown op {op!r}"})

    def _spawn(self, conn: socket.socket, request: dict[str, Any], log_fd: int | None) -> None:
        try:
            job = zygote_child.Job.from_request(request)
        except (KeyError, TypeError, ValueError) as exc:
            _send(conn, {"ok": False, "error": f"bad spawn request: {exc}"})
            return
        if job.module not in self.modules:
            _send(conn, {"ok": False, "error": f"{job.module} is not preloaded here"})
            return
        started = time.monotonic()
        try:
            pid, go = self._fork(job, log_fd, conn)
        except OSError as exc:
            _send(conn, {"ok": False, "error": f"fork failed: {exc}"})
            return
        forked = time.monotonic()
        self.pages.forked(pid)
        acked = False
        try:
            _send(conn, {"ok": True, "pid": pid})
            acked = _acked(conn, pid)
            if acked:
                os.write(go, b"g")  # memd has taken the child on: let it run
        except OSError:
            pass  # closing `go` without a byte makes the child exit
        finally:
            os.close(go)
        print(
            json.dumps(
                {
                    "event": "zygote_forked",
                    "pid": pid,
                    "module": job.module,
                    "fork_ms": round(1000 * (forked - started), 1),
                    "ack_ms": round(1000 * (time.monotonic() - forked), 1),
                    "acked": acked,
                }
            ),
            flush=True,
        )

    def _fork(
        self, job: zygote_child.Job, log_fd: int | None, conn: socket.socket
    ) -> tuple[int, int]:
        """Fork the intermediate, which forks the child, reports its pid and exits;
        returns (pid, go fd). Only the zygote and the intermediate are on this path: the
        child adopts itself (PDEATHSIG, title) while memd is being told."""
        pid_r, pid_w = os.pipe()
        go_r, go_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        middle = os.fork()
        if middle == 0:  # the intermediate: never returns
            os.close(pid_r)
            os.close(go_w)
            self._close_in_fork(conn)
            me = os.getpid()  # not getppid() in the child: this process may be gone by then
            child = os.fork()
            if child == 0:
                os.close(pid_w)
                zygote_child.become(job, log_fd, go_r, middle_pid=me)
            os.write(pid_w, f"{child}\n".encode())
            os._exit(0)
        os.close(pid_w)
        os.close(go_r)
        try:
            answer = _read_line(pid_r, SPAWN_TIMEOUT)
            os.waitpid(middle, 0)  # once reaped, its child belongs to the subreaper
        finally:
            os.close(pid_r)
        if not answer.isdigit():
            os.close(go_w)
            raise OSError("the intermediate process did not report its child")
        return int(answer), go_w

    def _close_in_fork(self, conn: socket.socket) -> None:
        conn.close()
        self.listener.close()


def _read_line(fd: int, timeout: float) -> str:
    """One newline-terminated line from a pipe (the writer's copies may stay open)."""
    deadline = time.monotonic() + timeout
    out = b""
    while b"\n" not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        out += chunk
    return out.decode("ascii", "replace").strip()


def _acked(conn: socket.socket, pid: int, timeout: float = ACK_TIMEOUT) -> bool:
    """memd confirms it took the child on; without that (it gave up waiting, or died)
    the child must not run unsupervised."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = conn.recv(MAX_MESSAGE)
        except TimeoutError:
            continue
        except OSError:
            return False
        if not data:
            return False
        try:
            message = json.loads(data)
        except ValueError:
            return False
        return isinstance(message, dict) and message.get("ack") == pid
    return False


def _same_user(conn: socket.socket) -> bool:
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memd.supervision.zygote")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--parent", type=int, required=True, help="memd's pid")
    parser.add_argument(
        "--module",
        action="append",
        dest="modules",
        required=True,
        help="a module to fork `python -m MODULE` for (repeat)",
    )
    parser.add_argument(
        "--preload", action="append", default=[], help="a module to import first (repeat)"
    )
    parser.add_argument(
        "--page-out-delay",
        type=float,
        default=PAGE_OUT_DELAY,
        help="seconds after the last fork (or a forked child's exit) before the library "
        "pages no child maps are given back (memd.supervision.zygote_pageout)",
    )
    args = parser.parse_args(argv)
    modules = tuple(args.modules)
    os.umask(0o077)
    started = time.monotonic()
    failed = preload(args.preload, modules)
    zygote = Zygote(args.socket.absolute(), args.parent, modules, args.page_out_delay)
    zygote.bind()
    print(
        json.dumps(
            {
                "event": "zygote_ready",
                "pid": os.getpid(),
                "threads": thread_count(),
                "preload_s": round(time.monotonic() - started, 2),
                "preload_failed": failed,
            }
        ),
        flush=True,
    )
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
