"""Bounds on the browser's HTTP listener: a connection cap and a header-read timeout.

The UI's port is reachable by every local user, so no one may hold its descriptors or
its event loop: past `max_connections` a new connection is closed as soon as it is
accepted, and a connection that has not sent a whole request head within
`header_timeout` seconds of connecting (or of its last answer) is closed. aiohttp has
neither, so each connection's protocol (aiohttp's request handler) is wrapped here, and
the app's first middleware tells the guard when a request head has arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Guard:
    """Counts and times the connections of one listener."""

    def __init__(self, max_connections: int, header_timeout: float) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.open: dict[asyncio.BaseTransport, _Guarded] = {}
        self.refused = 0
        self.timed_out = 0

    def protocol(self, make: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        return _Guarded(self, make)

    def busy(self, transport: asyncio.BaseTransport) -> None:
        """A request head arrived: its connection's timer waits until the answer is out."""
        conn = self.open.get(transport)
        if conn is not None:
            conn.disarm()

    def idle(self, transport: asyncio.BaseTransport) -> None:
        """An answer went out: the next request head must come within the timeout."""
        conn = self.open.get(transport)
        if conn is not None:
            conn.arm()

    def counts(self) -> dict[str, int]:
        return {"connections": len(self.open), "refused": self.refused, "timed_out": self.timed_out}


class _Guarded(asyncio.Protocol):
    """aiohttp's handler for one connection, forwarded to unless the guard closed it."""

    def __init__(self, guard: Guard, make: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self.make = make
        self.inner: Any = None
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self.guard.open) >= self.guard.max_connections:
            self.guard.refused += 1
            transport.abort()
            return
        self.transport = transport
        self.guard.open[transport] = self
        self.inner = self.make()
        self.inner.connection_made(transport)
        self.arm()

    def arm(self) -> None:
        self.disarm()
        self.timer = asyncio.get_running_loop().call_later(self.guard.header_timeout, self._expire)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.guard.timed_out += 1
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.transport is not None:
            self.guard.open.pop(self.transport, None)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()
