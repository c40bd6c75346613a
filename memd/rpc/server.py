"""The JSON-RPC server on memd's socket: lifecycle, peer check, the connection bound, cleanup.

Framing: one message (request, notification or batch) per line, UTF-8, `\\n`-terminated;
blank lines are ignored. Responses are ASCII JSON (non-ASCII escaped), one per line.

Ordering: each request runs as its own task, so responses on one connection are written in
**completion order**, not request order; clients match them by `id`. A slow call never holds
up a fast one, on the same connection or another. Pipelining is bounded: past
`max_inflight` unanswered requests a connection stops being read until one completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import structlog

from memd.config import LimitsConfig
from memd.errors import Busy
from memd.rpc import unix_socket
from memd.rpc.connection import READ_CHUNK, Connection
from memd.rpc.protocol import MAX_BATCH, MAX_LINE, Dispatcher, Registry, encode, error_response
from memd.rpc.unix_socket import SocketSetupError

log = structlog.get_logger()

MAX_INFLIGHT = 64
# The config's defaults (`[limits]`), for a server made without a config (tests, tools).
MAX_CONNECTIONS = LimitsConfig().max_connections
MAX_BUFFERED = LimitsConfig().max_buffered_bytes  # unfinished-line bytes over all connections
BACKLOG = 256


class RpcServer:
    """The JSON-RPC server on a Unix socket, with an explicit start/close lifecycle.

    start(): the parent directory is created 0700 if missing; an existing one must be ours
    and not group/world-writable (it is never chmod-ed: it may be the user's own folder).
    `<socket>.lock` (flock, kept on disk) makes one server own the path at a time; a socket
    file left by a crashed run is replaced, but one that answers connect() is never stolen
    (SocketInUse). The socket is bound, chmod-ed 0600, and only then listens, so nobody can
    connect before its mode is final. Peers whose uid (SO_PEERCRED) is not `allowed_uid`
    are disconnected unserved.

    close(): stops accepting and removes the socket file, lets in-flight requests finish and
    their responses go out for up to `timeout` seconds, then cancels what is left.
    """

    def __init__(
        self,
        path: Path,
        registry: Registry,
        max_line: int = MAX_LINE,
        *,
        allowed_uid: int | None = None,
        max_batch: int = MAX_BATCH,
        max_inflight: int = MAX_INFLIGHT,
        max_connections: int = MAX_CONNECTIONS,
        max_buffered: int = MAX_BUFFERED,
    ) -> None:
        self.path = Path(path)
        self.dispatcher = Dispatcher(registry, max_batch)
        self.max_line = max_line
        self.max_inflight = max_inflight
        # Settable while serving (a config reload): checked at each connect and read.
        self.max_connections = max_connections
        self.max_buffered = max_buffered
        self.buffered = 0  # bytes of unfinished lines held, over all connections
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self._server: asyncio.Server | None = None
        self._lock_fd: int | None = None
        self._socket_id: tuple[int, int] | None = None
        self._connections: dict[Connection, asyncio.Task[None]] = {}
        self._closing = False

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        if self._server is not None or self._closing:
            raise RuntimeError("an RpcServer starts once; make a new one to listen again")
        if len(os.fsencode(self.path)) >= 104:  # sun_path: 108 bytes on Linux, 104 on macOS
            raise SocketSetupError(f"socket path too long for AF_UNIX: {self.path}")
        unix_socket.prepare_dir(self.path.parent)
        self._lock_fd = unix_socket.lock(self.path)
        sock = None
        try:
            await unix_socket.clear_stale(self.path)
            sock = unix_socket.bind(self.path)
            st = os.stat(self.path)
            self._socket_id = (st.st_dev, st.st_ino)
            self._server = await asyncio.start_unix_server(
                self._on_connect, sock=sock, limit=READ_CHUNK, backlog=BACKLOG
            )
        except BaseException:
            if sock is not None:
                sock.close()
            self._unlink_socket()
            os.close(self._lock_fd)
            self._lock_fd = None
            raise
        log.info("rpc.listening", path=str(self.path))

    async def close(self, timeout: float = 5.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        self._unlink_socket()
        for conn in self._connections:
            conn.stop()
        tasks = set(self._connections.values())
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await server.wait_closed()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("rpc.closed", path=str(self.path))

    async def __aenter__(self) -> RpcServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pid, uid = unix_socket.peer_cred(writer.get_extra_info("socket"))
        except OSError:  # the peer is already gone
            writer.transport.abort()
            return
        if self._closing or (uid is not None and uid != self.allowed_uid):
            if not self._closing:
                log.warning("rpc.peer_refused", peer_uid=uid, peer_pid=pid)
            writer.transport.abort()
            return
        if len(self._connections) >= self.max_connections:
            log.warning(
                "rpc.connection_refused",
                connections=len(self._connections),
                limit=self.max_connections,
            )
            exc = Busy(
                f"memd already serves {self.max_connections} connections "
                "(limits.max_connections); retry later",
                data={"limit": self.max_connections},
            )
            writer.write(encode(error_response(exc, None)))
            writer.close()
            return
        conn = Connection(self, reader, writer)
        task = asyncio.get_running_loop().create_task(conn.serve())
        conn.task = task
        self._connections[conn] = task
        task.add_done_callback(lambda _t: self._connections.pop(conn, None))

    def _unlink_socket(self) -> None:
        """Remove the socket file, but only the one we bound (never a successor's)."""
        if self._socket_id is None:
            return
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._socket_id:
                os.unlink(self.path)
        self._socket_id = None
