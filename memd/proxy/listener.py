"""The proxy's listening socket: a cap on connections and a deadline for a request's head.

The proxy's port is reachable by every local user. aiohttp holds a connection that never
sends a request until its keep-alive timeout, and accepts as many as the kernel hands it,
so 1,100 idle connections once took every descriptor memd had (issue 24, item 7). Here:

- a connection that has not sent a whole request head within `HEADER_TIMEOUT` (or idles
  that long between requests) is closed: aiohttp's keep-alive timer starts when the
  connection is made;
- at most `cap` connections are served at once (`memd.fds.listener_cap`: 512, or fewer
  when the open-file limit is small); one past that is closed as soon as it is accepted,
  so it costs a descriptor for a moment only, and is counted (`refused_connections`).
"""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from memd.fds import listener_cap

log = structlog.get_logger()

HEADER_TIMEOUT = 15.0  # seconds for a request head, and of idleness between requests
MAX_CONNECTIONS = 512
PER_CONNECTION = 4  # the client's, the upstream's, and both ends of a call to memd's socket
REFUSED_LOG_EVERY = 60.0  # seconds between log lines about refused connections


class _Refused(asyncio.Protocol):
    """A connection past the cap: closed at once, nothing read or written."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class CappedListener:
    """An asyncio server for an aiohttp runner's request handlers, with a cap."""

    def __init__(self, runner: web.AppRunner) -> None:
        self.runner = runner
        self.cap = listener_cap(MAX_CONNECTIONS, PER_CONNECTION)
        self.refused = 0
        self._logged_at = -REFUSED_LOG_EVERY
        self._server: asyncio.Server | None = None

    def _protocol(self) -> asyncio.Protocol | RequestHandler:
        server = self.runner.server
        assert server is not None, "runner.setup() first"
        if len(server.connections) < self.cap:
            return server()
        self.refused += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= REFUSED_LOG_EVERY:
            self._logged_at = now
            log.warning("proxy.connections_full", cap=self.cap, refused_so_far=self.refused)
        return _Refused()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; the address actually bound (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, host, port, reuse_address=True, backlog=128
        )
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
