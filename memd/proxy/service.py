"""The proxy's lifecycle: listen, serve, close; run inside `memd run` or on its own.

Inside `memd run` the daemon holds a `ProxyService` (memd.proxy.hook, which imports this
module only when the proxy is enabled): it starts the proxy once memd's socket is ready,
applies config reloads (a new `listen` address means a restart, the rest applies to the
next request), adds the proxy's counters to `daemon.status`, and closes it first on
shutdown so pending records still reach memd. A proxy that cannot listen (port taken) is
reported in the status; memd goes on without it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from memd.config import Config, ConfigError, load_config
from memd.fds import raise_open_files
from memd.proxy.keys import KeyStore
from memd.proxy.listener import HEADER_TIMEOUT, CappedListener
from memd.proxy.recorder import Recorder, Stats
from memd.proxy.rpc import AsyncMemdClient
from memd.proxy.server import ProxyApp

log = structlog.get_logger()


class ProxyServer:
    """One listening proxy: setup in `start()`, everything released in `close()`."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        first = config()
        self.stats = Stats()
        self.rpc = AsyncMemdClient(first.socket)
        self.recorder = Recorder(self.rpc, self.stats)
        self.keys = KeyStore(first.memory_dir)
        self.url: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._listener: CappedListener | None = None

    async def start(self) -> None:
        host, port = self.config().proxy.address
        # trust_env=False: no HTTP(S)_PROXY or netrc from the environment; the upstream
        # and its key are what memd's config names, nothing else.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, enable_cleanup_closed=True), trust_env=False
        )
        app = ProxyApp(self.config, self.rpc, self.keys, self.stats, self.recorder, self._session)
        runner = web.AppRunner(
            app.application(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
            keepalive_timeout=HEADER_TIMEOUT,  # also the deadline of a request's head
        )
        await runner.setup()
        listener = CappedListener(runner)
        try:
            bound = await listener.start(host, port)
        except BaseException:
            await runner.cleanup()
            await self._session.close()
            raise
        self._runner, self._listener = runner, listener
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/v1"
        log.info("proxy.listening", url=self.url, upstream=self.config().proxy.upstream_base_url)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if self._listener is not None:
            await self._listener.close()
        if runner is not None:
            await runner.cleanup()
        await self.recorder.drain()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.rpc.close()
        if runner is not None:
            log.info("proxy.closed", url=self.url)

    def status(self) -> dict[str, Any]:
        return {
            "state": "running" if self._runner else "stopped",
            "url": self.url,
            "upstream": self.config().proxy.upstream_base_url,
            **self.stats.as_dict(),
            "max_connections": self._listener.cap if self._listener else None,
            "refused_connections": self._listener.refused if self._listener else 0,
        }


class _FileConfig:
    """The config for a standalone proxy: re-read when the file changes, last good kept."""

    def __init__(self, path: Path, config: Config) -> None:
        self.path = path
        self.current = config
        self._seen = _signature(path)

    def __call__(self) -> Config:
        seen = _signature(self.path)
        if seen != self._seen:
            self._seen = seen
            try:
                self.current = load_config(self.path)
            except ConfigError as exc:
                log.error("config.rejected", error=str(exc))
        return self.current


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)


async def serve_standalone(path: Path, config: Config) -> int:
    """`memd proxy`: serve until SIGINT/SIGTERM, talking to the memd at config.socket."""
    raise_open_files()  # as `memd run` does: see memd/fds.py
    server = ProxyServer(_FileConfig(path, config))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(f"memd proxy listening on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
    return 0


async def served_by_memd(config: Config) -> str | None:
    """The URL of the proxy the `memd run` at config.socket serves on config's address,
    or None (no memd, no proxy there, or another address): for `memd proxy`, whose
    "address already in use" would otherwise hide that the proxy is already running."""
    rpc = AsyncMemdClient(config.socket, timeout=5.0)
    try:
        status = await rpc.call("daemon.status")
    except Exception:  # any failure means "cannot tell"
        return None
    finally:
        await rpc.close()
    proxy = status.get("proxy") if isinstance(status, dict) else None
    if not isinstance(proxy, dict) or proxy.get("state") != "running":
        return None
    url = proxy.get("url")
    if not isinstance(url, str):
        return None
    port = config.proxy.address[1]
    return url if url.rsplit("/", 1)[0].endswith(f":{port}") and port else None
