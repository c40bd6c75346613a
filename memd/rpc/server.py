"""The JSON-RPC server's socket: setup, peer check, connections, framing limits, cleanup.

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
import fcntl
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

import structlog

from memd import trust
from memd.errors import Busy, ParseError, PayloadTooLarge
from memd.rpc.protocol import (
    MAX_BATCH,
    MAX_LINE,
    Dispatcher,
    Registry,
    decode,
    encode,
    error_response,
)

log = structlog.get_logger()

MAX_INFLIGHT = 64
MAX_CONNECTIONS = 256
MAX_BUFFERED = 256 * 1024 * 1024  # unfinished-line bytes over all connections
READ_CHUNK = 64 * 1024
OFFLOAD_DECODE = 1024 * 1024  # lines longer than this are decoded in a thread
BACKLOG = 256


# --- the socket -----------------------------------------------------------------------


class SocketSetupError(Exception):
    """The socket cannot be set up safely, so memd must not start serving."""


class SocketInUse(SocketSetupError):
    """Another process (a live memd, or anything answering) already listens on the path."""


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
        self._connections: dict[_Connection, asyncio.Task[None]] = {}
        self._closing = False

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        if self._server is not None or self._closing:
            raise RuntimeError("an RpcServer starts once; make a new one to listen again")
        if len(os.fsencode(self.path)) >= 104:  # sun_path: 108 bytes on Linux, 104 on macOS
            raise SocketSetupError(f"socket path too long for AF_UNIX: {self.path}")
        _prepare_dir(self.path.parent)
        self._lock_fd = _lock(self.path)
        sock = None
        try:
            await _clear_stale(self.path)
            sock = _bind(self.path)
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
            pid, uid = _peer_cred(writer.get_extra_info("socket"))
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
        conn = _Connection(self, reader, writer)
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


class _Connection:
    """One client: reads lines, runs each request as a task, writes responses as they finish."""

    def __init__(
        self, server: RpcServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._dispatcher = server.dispatcher
        self._server = server
        self._pending = bytearray()
        self._max_line = server.max_line
        self._reader = reader
        self._writer = writer
        self._slots = asyncio.Semaphore(server.max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading = False
        self._stopping = False
        self.task: asyncio.Task[None] | None = None

    def stop(self) -> None:
        """Stop reading new requests; in-flight ones still finish and answer."""
        self._stopping = True
        if self._reading and self.task is not None:
            self.task.cancel()

    async def serve(self) -> None:
        try:
            self._reading = True
            try:
                await self._read_loop()
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
            finally:
                self._reading = False
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            self._writer.close()
            await self._writer.wait_closed()
        except asyncio.CancelledError:
            # close() ran out of patience: cancel the handlers and give them a moment to
            # unwind, then end normally (this task is ours; nobody awaits its cancellation).
            self._abort()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=1.0)
        except OSError:
            self._abort()  # the peer went away while we were flushing
        except Exception:
            log.exception("rpc.connection_failed")
            self._abort()

    async def _read_loop(self) -> None:
        try:
            await self._read_lines()
        finally:
            self._server.buffered -= len(self._pending)
            self._pending.clear()

    async def _next_line(self) -> bytes | None:
        """The next line (None: the connection is done), holding its unfinished part in
        `_pending`, counted against the per-line and the server-wide bounds."""
        pending, server = self._pending, self._server
        scanned = 0
        while (end := pending.find(b"\n", scanned)) < 0:
            scanned = len(pending)
            if scanned > self._max_line:
                await self._refuse_oversize()
                return None
            if server.buffered > server.max_buffered:
                await self._refuse_buffered()
                return None
            try:
                chunk = await self._reader.read(READ_CHUNK)
            except OSError:
                return None
            if not chunk:  # EOF: an unterminated last line still counts as a line
                if not pending:
                    return None
                pending += b"\n"
                server.buffered += 1
                end = len(pending) - 1
                break
            pending += chunk
            server.buffered += len(chunk)
        if end > self._max_line:
            await self._refuse_oversize()
            return None
        line = bytes(pending[: end + 1])
        del pending[: end + 1]
        server.buffered -= len(line)
        return line

    async def _read_lines(self) -> None:
        while (line := await self._next_line()) is not None:
            if line.isspace():
                continue
            try:
                if len(line) > OFFLOAD_DECODE:  # megabytes of JSON: not on the event loop
                    message = await asyncio.to_thread(decode, line)
                else:
                    message = decode(line)
            except ParseError as exc:
                await self._send(encode(error_response(exc, None)))
                continue
            await self._slots.acquire()
            task = asyncio.create_task(self._respond(message))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _respond(self, message: Any) -> None:
        response = await self._dispatcher.dispatch(message)
        if response is not None:
            await self._send(encode(response))

    async def _send(self, data: bytes) -> None:
        writer = self._writer
        if writer.is_closing():
            return
        writer.write(data)
        with contextlib.suppress(OSError):
            await writer.drain()

    async def _refuse_buffered(self) -> None:
        limit = self._server.max_buffered
        log.warning("rpc.buffered_limit", limit=limit)
        exc = Busy(
            f"memd holds over {limit} bytes of unfinished lines from all connections "
            "(limits.max_buffered_mib); closing this one, retry later",
            data={"limit": limit},
        )
        await self._send(encode(error_response(exc, None)))

    async def _refuse_oversize(self) -> None:
        log.warning("rpc.payload_too_large", limit=self._max_line)
        exc = PayloadTooLarge(
            f"message longer than the line limit of {self._max_line} bytes; closing connection",
            data={"limit": self._max_line},
        )
        await self._send(encode(error_response(exc, None)))

    def _abort(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._writer.transport.abort()


def _prepare_dir(directory: Path) -> None:
    """Create missing directories 0700; refuse an existing one that others could write to,
    and any folder on the way from `/` that others could use to swap it (trust.check_chain:
    OpenSSH's StrictModes rule)."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    _check_chain(current if missing else directory.parent)  # the folder itself: below
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise SocketSetupError(f"{directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise SocketSetupError(
            f"{directory} belongs to uid {st.st_uid}, not to us; "
            "put the socket in a directory of your own"
        )
    if st.st_mode & 0o022:
        raise SocketSetupError(
            f"{directory} is writable by group or others, so the socket "
            f"could be replaced; run `chmod go-w {directory}` or choose "
            "another socket path"
        )
    _check_chain(directory)


def _check_chain(directory: Path) -> None:
    try:
        trust.check_chain(directory)
    except trust.UntrustedPath as exc:
        raise SocketSetupError(f"refusing socket {directory}: {exc}") from None


def _lock(path: Path) -> int:
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = trust.open_nofollow(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except trust.UntrustedPath as exc:
        raise SocketSetupError(f"cannot lock the socket: {exc}") from None
    except OSError as exc:
        raise SocketSetupError(
            f"cannot open the socket's lock file {lock_path}: {exc.strerror}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SocketInUse(f"another memd is already listening on {path}") from None
    return fd


async def _clear_stale(path: Path) -> None:
    """Remove a socket file that nobody answers on; never touch a live one or a non-socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketSetupError(f"{path} exists and is not a socket; refusing to replace it")
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 2.0)
    except ConnectionRefusedError:
        os.unlink(path)
        log.info("rpc.stale_socket_removed", path=str(path))
        return
    except (TimeoutError, BlockingIOError):
        pass  # a listener with a full backlog is still a listener
    except OSError as exc:
        raise SocketSetupError(f"cannot probe existing socket {path}: {exc}") from exc
    else:
        writer.close()
    raise SocketInUse(f"another memd is already listening on {path}")


def _bind(path: Path) -> socket.socket:
    """A bound, 0600, not-yet-listening socket: connect() fails until listen()."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    try:
        os.chmod(path, 0o600)
    except BaseException:
        sock.close()
        os.unlink(path)  # ours: we hold the lock and nothing was listening here
        raise
    return sock


def _peer_cred(sock: Any) -> tuple[int | None, int | None]:
    """(pid, uid) of the peer; (None, None) where the platform cannot tell."""
    if hasattr(socket, "SO_PEERCRED"):  # Linux: struct ucred {pid_t; uid_t; gid_t}
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
        pid, uid, _gid = struct.unpack("iII", raw)
        return pid, uid
    if hasattr(socket, "LOCAL_PEERCRED"):  # macOS/BSD: struct xucred {u_int version; uid_t; ...}
        raw = sock.getsockopt(0, socket.LOCAL_PEERCRED, struct.calcsize("IIh16I"))
        return None, struct.unpack_from("II", raw)[1]
    return None, None
