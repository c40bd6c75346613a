"""memd's side of the shared index server: one supervised child for every client's index.

With `[supervision] shared_index_server = true`, `Pipelines` gets a client's index from
here (through `memd.indexing.daemon.servers.SharedServers`) instead of a `<client>/index`
child: the client goes into the manifest
(`<memory_dir>/.memd/index-clients.json`), the one child `_shared/index` (a
`memd.indexing.children.shared_index_server`, forked from the zygote like the others) is told
to sync, and the client's watcher is gated on its own socket answering. The child's
name stands in every such client's list of children, so `daemon.status` shows its state
as the client's `index_server`, `clients.reset` resets it, and catch-up runs after its
restarts (its pid changes) exactly as after a per-client server's.

A crash of the child is an ordinary restart with backoff; the new process reads the
manifest and serves every client again before its control socket answers, i.e. before
it is RUNNING, so watchers and catch-up find their sockets. If it goes FATAL (it cannot
be started), `on_fatal` runs once and memd falls back to a server per client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from memd import trust
from memd.indexing import children as programs
from memd.indexing.children import index_ready
from memd.indexing.daemon.plan import server_env
from memd.indexing.daemon.settings import runtime_socket
from memd.supervision import ChildSpec, Supervisor
from memd.supervision.spec import Transition
from memd.supervision.states import ProcessStates

log = structlog.get_logger()

SHARED_NAME = "_shared/index"  # a client id starts with a letter or digit: no clash
SHARED_MODULE = programs.SHARED_INDEX_SERVER
SYNC_TIMEOUT = 120.0  # opening a database after an unclean stop rebuilds its index files
WAIT_READY = 30.0  # seconds a removal waits for a starting child before syncing it
RETRY_FAILED_AFTER = 600.0  # a client that could not open is tried again (as FATAL children)
SYNC_AGAIN = 1.0  # seconds before a sync that got no answer is tried again


def is_shared_server(argv: Sequence[str]) -> bool:
    """Whether `argv` is a shared index server as memd starts it (interpreter and module)."""
    return list(argv[:3]) == [sys.executable, "-m", SHARED_MODULE]


class SharedIndex:
    """The shared child, its manifest and its control socket, for `Pipelines`."""

    def __init__(
        self,
        supervisor: Supervisor,
        memory_dir: Path,
        *,
        prefers: Callable[[], tuple[str, ...]],
        on_fatal: Callable[[], Awaitable[None]],
    ) -> None:
        self.supervisor = supervisor
        state = memory_dir / ".memd"
        self.control = self.control_path(memory_dir)
        self.manifest = state / "index-clients.json"
        self._state = state
        self._prefers = prefers
        self._on_fatal = on_fatal
        self._clients: dict[str, tuple[Path, Path]] = {}
        self._synced_pid: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.failed = False  # went FATAL once: memd runs a server per client from then on
        # Clients the running process could not open (a broken database), from its last
        # sync answer: status shows them FATAL, as a per-client server that cannot start.
        self.client_errors: dict[str, str] = {}
        self._retry_at: float | None = None  # when those are tried again
        # Set when the child reaches RUNNING or FATAL (or a retry is asked): `_watch` looks.
        self._look = asyncio.Event()
        supervisor.listen(self._on_transition)

    @staticmethod
    def control_path(memory_dir: Path) -> Path:
        """In the runtime dir, as the zygote's: a Unix socket path must stay short."""
        return runtime_socket("index-shared", memory_dir)

    def spec(self) -> ChildSpec:
        argv = [sys.executable, "-m", SHARED_MODULE, "--manifest", str(self.manifest)]
        argv += ["--control", str(self.control)]
        return ChildSpec(
            name=SHARED_NAME,
            argv=tuple(argv),
            env=server_env(),
            cwd=self._state,
            log_path=self._state / "logs" / "index-shared.log",
            pidfile=self._state / "index-shared.pid",
            startsecs=0.0,
            stop_signal=signal.SIGINT,
            stop_timeout=10.0,
            ready=functools.partial(index_ready, self.control, timeout=0.2),
            ready_timeout=SYNC_TIMEOUT,
            restart_at_once=True,
        )

    @property
    def clients(self) -> tuple[str, ...]:
        """The clients it serves (or served until it went FATAL), in order."""
        return tuple(sorted(self._clients))

    def serving(self, sock: Path) -> Callable[[], bool]:
        """The watcher's gate: its client's socket answers."""
        return functools.partial(index_ready, sock, timeout=0.2)

    async def add(self, client_id: str, data_dir: Path, sock: Path) -> str:
        """Serve the client's database on its socket; returns the child's name."""
        self._clients[client_id] = (data_dir, sock)
        await asyncio.to_thread(self._write_manifest)
        if SHARED_NAME not in self.supervisor:
            self._synced_pid = None
            self.supervisor.add(self.spec(), prefers=self._prefers())
        elif self.supervisor.is_ready(SHARED_NAME):
            await self.sync()
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="shared-index")
        return SHARED_NAME

    async def remove(self, client_id: str) -> None:
        """Stop serving the client (its database is closed when this returns, if the
        child runs: a rebuild deletes the files next). The last client stops the child."""
        self._clients.pop(client_id, None)
        await asyncio.to_thread(self._write_manifest)
        if SHARED_NAME not in self.supervisor:
            return
        if not self._clients:
            await self.supervisor.remove(SHARED_NAME)
            return
        # A starting process may have read the manifest before this write.
        if await self.supervisor.wait_ready(SHARED_NAME, WAIT_READY):
            await self.sync()

    async def sync(self) -> dict[str, Any] | None:
        """Tell the child to re-read the manifest; its answer, None if it did not give one."""
        pid = self._pid(self.supervisor.child(SHARED_NAME))
        try:
            answer = await asyncio.wait_for(self._request({"op": "sync"}), SYNC_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("index.shared_sync_failed", error=str(exc))
            return None
        self._synced_pid = pid
        failed = answer.get("failed") or {}
        self.client_errors = {str(cid): str(error) for cid, error in failed.items()}
        loop = asyncio.get_running_loop()
        self._retry_at = loop.time() + RETRY_FAILED_AFTER if failed else None
        self._look.set()  # `_watch` waits for the new retry time
        for client_id, error in failed.items():
            log.error("index.shared_client_failed", client=client_id, error=error)
        return answer

    def retry(self, client_id: str) -> bool:
        """`clients.reset`: try a client that could not open again, at once."""
        if client_id not in self.client_errors:
            return False
        self._retry_at = 0.0
        self._look.set()
        return True

    @staticmethod
    def _pid(child: Any) -> int | None:
        return child.proc.pid if child.proc is not None else None

    async def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        reader, writer = await asyncio.open_unix_connection(str(self.control))
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError(f"unexpected answer: {line!r}")
        return answer

    def _write_manifest(self) -> None:
        """Replace the manifest whole (fsynced), so the child never reads half of it."""
        clients = {
            cid: {"data_dir": str(data_dir), "socket": str(sock)}
            for cid, (data_dir, sock) in sorted(self._clients.items())
        }
        self._state.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._state, prefix=".index-clients.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"clients": clients}, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.manifest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        trust.fsync_dir(self._state)

    def _on_transition(self, change: Transition) -> None:
        if change.name == SHARED_NAME and change.new in (
            ProcessStates.RUNNING,
            ProcessStates.FATAL,
        ):
            self._look.set()

    def _next_look(self, failed_sync: bool) -> float | None:
        """Seconds until `_watch` must look without a transition: soon after a sync that
        got no answer (the child may be busy opening databases), else at the retry time
        of clients that failed to open. None: only a transition (or a retry asked) wakes
        it; a retry already due is done by the look after the child's next RUNNING."""
        wait = SYNC_AGAIN if failed_sync else None
        if self._retry_at is not None:
            left = self._retry_at - asyncio.get_running_loop().time()
            if left > 0:
                wait = left if wait is None else min(wait, left)
        return wait

    async def _watch(self) -> None:
        """Sync each new process once it runs (it may have read an older manifest), and
        fall back once if the child goes FATAL. Woken by those transitions, by the retry
        time of clients that failed to open and after a failed sync, not by a timer."""
        failed_sync = False
        while not self.failed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._look.wait(), self._next_look(failed_sync))
            self._look.clear()
            failed_sync = False
            if SHARED_NAME not in self.supervisor:
                continue
            child = self.supervisor.child(SHARED_NAME)
            if child.state == ProcessStates.FATAL:
                self.failed = True
                log.error(
                    "index.shared_server_unavailable",
                    error=child.last_error,
                    fallback="one index server per client",
                )
                await self.supervisor.remove(SHARED_NAME)
                await self._on_fatal()
            elif child.state == ProcessStates.RUNNING and (
                self._pid(child) != self._synced_pid or self._retry_due()
            ):
                failed_sync = await self.sync() is None

    def _retry_due(self) -> bool:
        return self._retry_at is not None and asyncio.get_running_loop().time() >= self._retry_at

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
