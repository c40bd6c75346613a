"""The browser once loaded: its pages (memd.ui.app) behind aiohttp's runner and the guard.

memd.ui.listener owns the port from `memd run`'s start and imports this module (aiohttp,
Jinja2) at the first connection; from then on it hands every connection to
`UiServer.protocol()`. The hook (memd.ui.hook) restarts the listener when `[ui]` changes
and closes it first on shutdown.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from memd.config import Config
from memd.proxy.rpc import AsyncMemdClient
from memd.ui.app import UiApp
from memd.ui.guard import Guard
from memd.ui.tokens import LoginTokens


class UiServer:
    """The loaded browser: its app and aiohttp runner. The port is memd.ui.listener's,
    which hands each connection to `protocol()`; `close()` releases everything."""

    def __init__(self, config: Config, bound: tuple[str, int]) -> None:
        ui = config.ui
        self.rpc = AsyncMemdClient(config.socket)
        self.guard = Guard(ui.max_connections, ui.header_timeout_seconds)
        self.app = UiApp(self.rpc, LoginTokens(config.memory_dir), self.guard)
        self.bound = bound
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        runner = web.AppRunner(
            self.app.application(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=2.0,
            keepalive_timeout=2 * self.guard.header_timeout,  # the guard cuts first
        )
        await runner.setup()
        self._runner = runner
        self.app.gate.bind(*self.bound)

    def protocol(self) -> asyncio.Protocol:
        """aiohttp's handler for one new connection, behind the guard."""
        assert self._runner is not None and self._runner.server is not None
        return self.guard.protocol(self._runner.server)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self.rpc.close()

    def counts(self) -> dict[str, int]:
        return self.guard.counts()
