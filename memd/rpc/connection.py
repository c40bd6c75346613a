"""One connection of the JSON-RPC server: read lines within the bounds, answer each request.

Each request runs as its own task, so responses are written in completion order; at most
`max_inflight` run at once per connection, past that the connection is not read until one
completes. Unfinished lines count against the server-wide `max_buffered` bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from memd.errors import Busy, ParseError, PayloadTooLarge
from memd.rpc.protocol import decode, encode, error_response

if TYPE_CHECKING:
    from memd.rpc.server import RpcServer

log = structlog.get_logger()

READ_CHUNK = 64 * 1024
OFFLOAD_DECODE = 1024 * 1024  # lines longer than this are decoded in a thread


class Connection:
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
            self._drop_unfinished()

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
            if not chunk:  # EOF: see _drop_unfinished
                self._drop_unfinished()
                return None
            pending += chunk
            server.buffered += len(chunk)
        if end > self._max_line:
            await self._refuse_oversize()
            return None
        with memoryview(pending) as view:  # one copy of the line, not two
            line = view[: end + 1].tobytes()
        del pending[: end + 1]
        server.buffered -= len(line)
        return line

    def _drop_unfinished(self) -> None:
        """An unfinished line at the end of the stream is not a message: the client
        went away (or gave up) mid-line. It is dropped unread; copying, decoding and
        answering megabytes nobody will read once kept 667 MB after 60 such lines of
        8 MiB closed (issue 24). The buffer itself is released, not just emptied."""
        if self._pending:
            log.info("rpc.unfinished_line_dropped", bytes=len(self._pending))
        self._server.buffered -= len(self._pending)
        self._pending = bytearray()

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
