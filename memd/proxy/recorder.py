"""Recording completed exchanges through `memory.record_chat`, off the answer's path.

The app gets its answer first; the record follows in the background, so memd's fsync is
not added to the app's latency, and a record that fails (memd down, payload too large,
an invalid message) never breaks the chat: it is logged and counted in the status.

Records of one client are written in the order their answers were sent (each waits for
the one before it): turn 2 of a chat must not reach memd before turn 1, or it would not
be seen as a continuation of it. That order is also what lets a turn name the record
of the one before (a `Continuation`, memd/proxy/responses.py): its `after` is looked up
only when its turn to be recorded comes, when the record before it is done.

A record refused with `busy` (memd is forgetting from that client's memory, which takes
seconds for a long chat) has written nothing, so it is sent again after the hint in the
error (`retry_after`), for up to BUSY_PATIENCE seconds; past that it counts as failed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import structlog

from memd.errors import Busy
from memd.proxy.rpc import AsyncMemdClient

log = structlog.get_logger()

BUSY_PATIENCE = 120.0  # seconds a record refused with `busy` keeps being retried


@dataclass
class Stats:
    """Counters shown under `proxy` in `memd status`."""

    requests: int = 0
    unauthorized: int = 0
    forwarded_without_memory: int = 0
    recorded: int = 0
    record_failures: int = 0
    last_record_error: str | None = None
    recall_calls: int = 0
    upstream_errors: int = 0
    memd_unavailable: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Continuation(Protocol):
    """A record whose messages follow an earlier record: decided when its turn comes."""

    def params(self, messages: list[Any]) -> tuple[list[Any], str | None]:
        """The messages to record and the `after` head they follow (None: the whole)."""
        ...

    def recorded(self, result: dict[str, Any]) -> None:
        """The record's answer (its `head` names the point a later turn continues)."""
        ...


class Recorder:
    """Background `memory.record_chat` calls, ordered per client, drained on close."""

    def __init__(self, rpc: AsyncMemdClient, stats: Stats) -> None:
        self.rpc = rpc
        self.stats = stats
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(
        self,
        client_id: str,
        messages: list[Any],
        response: dict[str, Any],
        continuation: Continuation | None = None,
    ) -> None:
        previous = self._tails.get(client_id)
        task = asyncio.create_task(
            self._record(previous, client_id, messages, response, continuation),
            name=f"proxy-record:{client_id}",
        )
        self._tails[client_id] = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(client_id, t))

    def _done(self, client_id: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._tails.get(client_id) is task:
            del self._tails[client_id]

    async def _record(
        self,
        previous: asyncio.Task[None] | None,
        client_id: str,
        messages: list[Any],
        response: dict[str, Any],
        continuation: Continuation | None = None,
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        started = time.monotonic()
        params: dict[str, Any] = {"client_id": client_id, "response": response}
        try:
            after = None
            if continuation is not None:
                messages, after = continuation.params(messages)
            params["messages"] = messages
            if after is not None:
                params["after"] = after
            result = await self._call(params)
            if continuation is not None:
                continuation.recorded(result)
        except asyncio.CancelledError:
            self._failed(client_id, "cancelled at shutdown")
            raise
        except Exception as exc:  # any failure is the record's, never the chat's
            self._failed(client_id, f"{type(exc).__name__}: {exc}")
            return
        self.stats.recorded += 1
        log.debug(
            "proxy.recorded",
            client=client_id,
            session=result.get("session_id"),
            conversation=result.get("conversation"),
            ms=round((time.monotonic() - started) * 1000, 2),
        )

    async def _call(self, params: dict[str, Any]) -> Any:
        """record_chat, sent again while memd answers `busy` (nothing was written)."""
        deadline = time.monotonic() + BUSY_PATIENCE
        while True:
            try:
                return await self.rpc.call("memory.record_chat", params)
            except Busy as exc:
                wait = exc.data.get("retry_after")
                if not isinstance(wait, int | float) or wait <= 0:
                    raise
                if time.monotonic() + wait > deadline:
                    raise
                log.info("proxy.record_busy", client=params["client_id"], retry_after=wait)
                await asyncio.sleep(wait)

    def _failed(self, client_id: str, error: str) -> None:
        self.stats.record_failures += 1
        self.stats.last_record_error = f"{client_id}: {error}"
        log.warning("proxy.record_failed", client=client_id, error=error)

    async def drain(self, timeout: float = 10.0) -> None:
        """Let pending records finish (bounded), then cancel what is left."""
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
