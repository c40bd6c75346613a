"""A front end's hook in `memd run`: the proxy's and the memory browser's, one lifecycle.

The daemon holds one hook per front end (a `memd.daemon` Service): `start` once memd's
socket is ready, `apply` on a config reload, `status` under its name in `daemon.status`,
`close` first on shutdown. A front end that cannot listen (its port is taken, say by a
second memd) is reported in the status and logged, and memd goes on without it. The
browser (`memd.ui`) takes this from the proxy's package as it takes the socket client:
both are front ends on memd's public socket API. The proxy's own hook (`ProxyService`)
is here too, away from its server, so `memd run` imports aiohttp only for a front end
that is enabled.
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import structlog

from memd.config import Config

if TYPE_CHECKING:
    from memd.proxy.service import ProxyServer

log = structlog.get_logger()


class Listening(Protocol):
    """One listening front end: setup in `start()`, everything released in `close()`."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


ServerT = TypeVar("ServerT", bound=Listening)


class FrontEndHook(ABC, Generic[ServerT]):
    """Starts, reports and closes one front end's server; `apply` is the subclass's."""

    name: str  # its key in daemon.status and the prefix of its log events
    # The server's module, imported (in a thread) only when the config enables the front
    # end: aiohttp and what it brings are ~14 MB of memd's PSS (bench/scale.py, one client)
    # that a memd with neither the proxy nor the browser need not carry.
    server_module: str

    def __init__(self) -> None:
        self.config: Config | None = None
        self.server: ServerT | None = None
        self.error: str | None = None

    @abstractmethod
    def _enabled(self, config: Config) -> bool:
        """Whether the config asks for this front end."""

    @abstractmethod
    def _listen(self, config: Config) -> str:
        """The configured address, as the user wrote it (for the error)."""

    @abstractmethod
    def _server(self, config: Config) -> ServerT:
        """A server for this config, not yet started."""

    @abstractmethod
    async def apply(self, config: Config) -> None:
        """A config reload: restart when what the server was built from changed."""

    async def start(self, config: Config) -> None:
        self.config = config
        self.error = None  # a past failure to listen says nothing about this config
        if not self._enabled(config):
            return
        await asyncio.to_thread(importlib.import_module, self.server_module)
        server = self._server(config)
        try:
            await server.start()
        except OSError as exc:
            await server.close()
            listen = self._listen(config)
            self.error = f"cannot listen on {listen}: {exc.strerror or exc}"
            log.error(f"{self.name}.start_failed", listen=listen, error=self.error)
            return
        self.server, self.error = server, None

    async def restart(self, config: Config) -> None:
        """Close what runs, then start on `config` (never overlapping: one port)."""
        await self.close()
        await self.start(config)

    def status(self) -> dict[str, Any] | None:
        if self.server is not None:
            return self.server.status()
        if self.error is not None:
            return {"state": "failed", "error": self.error}
        return None

    async def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.close()


class ProxyService(FrontEndHook["ProxyServer"]):
    """The daemon's hook: the proxy when `[proxy]` names an upstream, else nothing."""

    name = "proxy"
    server_module = "memd.proxy.service"

    def _enabled(self, config: Config) -> bool:
        return config.proxy.enabled

    def _listen(self, config: Config) -> str:
        return config.proxy.listen

    def _server(self, config: Config) -> ProxyServer:
        from memd.proxy.service import ProxyServer

        return ProxyServer(lambda: self.config)  # type: ignore[arg-type,return-value]

    async def apply(self, config: Config) -> None:
        """A reload: restart for a new address or on/off; otherwise the next request sees it."""
        old = self.config
        self.config = config
        if old is not None and (
            old.proxy.listen,
            old.proxy.enabled,
            old.socket,
            old.memory_dir,
        ) == (config.proxy.listen, config.proxy.enabled, config.socket, config.memory_dir):
            return
        await self.restart(config)
