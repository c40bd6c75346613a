"""An asyncio JSON-RPC client for memd's Unix socket: the proxy's only way into memd.

Framing is memd's: one JSON message per line, UTF-8, newline-terminated. memd answers
each request as it completes (not in request order), so replies are matched by `id`,
and one connection carries any number of concurrent calls. The connection is opened on
first use and again after it breaks; a call that was in flight when it broke fails with
`MemdUnavailable` (the proxy never retries such a record: a retry could write twice; a
`busy` refusal wrote nothing and is retried, see memd.proxy.recorder).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

from memd.errors import RpcError, error_from_dict

# Replies can carry recall text and session lists; memd's own request limit is 8 MiB.
MAX_REPLY = 32 * 1024 * 1024


class MemdUnavailable(Exception):
    """The daemon's socket could not be reached, or the connection broke mid-call."""


class AsyncMemdClient:
    """One multiplexed connection to memd; `call()` is safe from many tasks at once."""

    def __init__(self, path: str | Path, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()

    async def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Send one request and await its result; memd's errors come back as RpcError."""
        writer = await self._connection()
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            writer.write(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")
            await writer.drain()
            return await asyncio.wait_for(future, timeout or self.timeout)
        except TimeoutError:
            raise MemdUnavailable(
                f"memd did not answer {method} within {timeout or self.timeout} s"
            ) from None
        except (ConnectionError, OSError) as exc:
            self._broken(exc)
            raise MemdUnavailable(f"lost connection to memd: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        task, self._reader_task = self._reader_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._fail_pending(MemdUnavailable("the connection to memd was closed"))

    async def _connection(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                reader, writer = await asyncio.open_unix_connection(self.path, limit=MAX_REPLY)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise MemdUnavailable(f"memd is not running (no socket at {self.path})") from exc
            except OSError as exc:
                raise MemdUnavailable(f"cannot connect to memd at {self.path}: {exc}") from exc
            self._writer = writer
            self._reader_task = asyncio.create_task(
                self._read(reader, writer), name="memd-rpc-reader"
            )
            return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hand each reply line to the call waiting on its id, until the connection ends."""
        error: Exception = MemdUnavailable("memd closed the connection")
        try:
            while line := await reader.readline():
                self._deliver(line)
        except (ValueError, OSError) as exc:  # ValueError: a reply over MAX_REPLY
            error = MemdUnavailable(f"lost connection to memd: {exc}")
        if self._writer is writer:
            self._writer = None
        writer.close()
        self._fail_pending(error)

    def _deliver(self, line: bytes) -> None:
        try:
            reply = json.loads(line)
        except ValueError:
            return
        if not isinstance(reply, dict):
            return
        future = self._pending.get(reply.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if isinstance(reply.get("error"), dict):
            future.set_exception(error_from_dict(reply["error"]))
        else:
            future.set_result(reply.get("result"))

    def _broken(self, exc: BaseException) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)


__all__ = ["AsyncMemdClient", "MemdUnavailable", "RpcError"]
