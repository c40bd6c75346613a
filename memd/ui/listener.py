"""The browser's port, taken when memd starts; the browser itself loaded at first use.

aiohttp, Jinja2 and the pages are ~14 MB of memd's PSS (bench/scale.py, one client), and
most of memd's life nobody has the browser open. So `memd run` listens on `[ui] listen`
at once (a taken port is reported at start, and `memd ui` has its address), and the
first connection loads the browser (memd.ui.service) in a thread. Connections accepted
meanwhile wait with reading paused, their bytes unread in the kernel, and are handed to
the browser's guard (memd.ui.guard) in the order they came once it is loaded; from then
on each new connection goes straight to it.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING, Any

import structlog

from memd.config import Config

if TYPE_CHECKING:
    from memd.ui.service import UiServer

log = structlog.get_logger()


class LazyBrowser:
    """One listening browser: `start()` listens, `close()` releases everything."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.url: str | None = None
        self.error: str | None = None
        self.bound: tuple[str, int] = ("", 0)  # the address listened on, once started
        self._listener: asyncio.Server | None = None
        self._browser: UiServer | None = None
        self._loading: asyncio.Task[None] | None = None
        self._waiting: list[_Waiting] = []

    async def start(self) -> None:
        host, port = self.config.ui.address
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._protocol, host, port, reuse_address=True)
        bound_host, bound_port = self._listener.sockets[0].getsockname()[:2]
        self.bound = (bound_host, bound_port)
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}/"
        log.info("ui.listening", url=self.url)

    @property
    def loaded(self) -> bool:
        return self._browser is not None

    def _protocol(self) -> asyncio.Protocol:
        """A new connection: the browser's, or one that waits until it is loaded."""
        if self._browser is not None:
            return self._browser.protocol()
        waiting = _Waiting(self._waiting)
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())
        return waiting

    async def _load(self) -> None:
        try:
            module = await asyncio.to_thread(importlib.import_module, "memd.ui.service")
            browser: UiServer = module.UiServer(self.config, self.bound)
        except Exception as exc:  # nothing to serve with: say so, and stop listening
            await self._failed(exc)
            return
        try:
            await browser.start()
        except BaseException as exc:  # a failure, or close() while it started
            await browser.close()
            if not isinstance(exc, Exception):
                raise
            await self._failed(exc)
            return
        self._browser = browser
        waiting, self._waiting = self._waiting, []
        for conn in waiting:
            conn.hand_over(browser.protocol())
        log.info("ui.loaded", url=self.url, waited=len(waiting))

    async def _failed(self, exc: Exception) -> None:
        self.error = f"the browser could not load: {exc}"
        log.exception("ui.load_failed")
        await self._close_listener()

    async def close(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            await asyncio.gather(self._loading, return_exceptions=True)
        await self._close_listener()
        browser, self._browser = self._browser, None
        if browser is not None:
            await browser.close()
        log.info("ui.closed", url=self.url)

    async def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        waiting, self._waiting = self._waiting, []
        for conn in waiting:
            conn.abort()

    def status(self) -> dict[str, Any]:
        if self.error is not None:
            return {"state": "failed", "error": self.error, "url": self.url}
        counts = self._browser.counts() if self._browser is not None else {}
        return {
            "state": "running" if self._listener is not None else "stopped",
            "url": self.url,
            "loaded": self.loaded,
            "connections": counts.get("connections", len(self._waiting)),
            "refused": counts.get("refused", 0),
            "timed_out": counts.get("timed_out", 0),
        }


class _Waiting(asyncio.Protocol):
    """A connection accepted before the browser was loaded: it reads nothing until then."""

    def __init__(self, queue: list[_Waiting]) -> None:
        self.queue = queue
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()  # its request stays in the kernel until hand_over
        self.queue.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.queue:
            self.queue.remove(self)
        self.transport = None

    def hand_over(self, protocol: asyncio.Protocol) -> None:
        """The browser takes the connection as if it had just been accepted."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if not transport.is_closing():  # the guard may have refused it (over the cap)
            transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
