"""The browser's lifecycle inside `memd run`: listen on loopback, serve, close.

The daemon holds a `UiService` (a `memd.daemon` Service): it starts the browser once
memd's socket is ready, restarts it when `[ui]` changes, shows its address under `ui`
in `daemon.status`, and closes it first on shutdown. A browser that cannot listen
(the port is taken, say by a second memd) is reported in the status and logged; memd
goes on without it.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web

from memd.config import Config
from memd.proxy.hook import FrontEndHook
from memd.proxy.rpc import AsyncMemdClient
from memd.ui.app import UiApp
from memd.ui.guard import Guard, GuardedSite
from memd.ui.tokens import LoginTokens

log = structlog.get_logger()


class UiServer:
    """One listening browser: setup in `start()`, everything released in `close()`."""

    def __init__(self, config: Config) -> None:
        ui = config.ui
        self.rpc = AsyncMemdClient(config.socket)
        self.guard = Guard(ui.max_connections, ui.header_timeout_seconds)
        self.app = UiApp(self.rpc, LoginTokens(config.memory_dir), self.guard)
        self.address = ui.address
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        host, port = self.address
        runner = web.AppRunner(
            self.app.application(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=2.0,
            keepalive_timeout=2 * self.guard.header_timeout,  # the guard cuts first
        )
        await runner.setup()
        site = GuardedSite(runner, host, port, self.guard)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        assert site.bound is not None
        bound_host, bound_port = site.bound
        self.app.gate.bind(bound_host, bound_port)
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}/"
        log.info("ui.listening", url=self.url)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            log.info("ui.closed", url=self.url)
        await self.rpc.close()

    def status(self) -> dict[str, Any]:
        return {
            "state": "running" if self._runner else "stopped",
            "url": self.url,
            **self.guard.counts(),
        }


class UiService(FrontEndHook[UiServer]):
    """The daemon's hook: the browser when `[ui] enabled`, else nothing."""

    name = "ui"

    def _enabled(self, config: Config) -> bool:
        return config.ui.enabled

    def _listen(self, config: Config) -> str:
        return config.ui.listen

    def _server(self, config: Config) -> UiServer:
        return UiServer(config)

    async def apply(self, config: Config) -> None:
        """A reload: restart when `[ui]` or where memd lives changed; else nothing to do."""
        old, self.config = self.config, config
        if old is not None and (old.ui, old.socket, old.memory_dir) == (
            config.ui,
            config.socket,
            config.memory_dir,
        ):
            return
        await self.restart(config)
