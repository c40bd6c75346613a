"""Wiring: config in force, services, the socket server, signals, readiness, hot reload."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil
import structlog
import watchfiles

from memd import __version__, fds, heap, trust
from memd.api import build_registry
from memd.config import Config, ConfigError, load_config
from memd.daemon.notify import SystemdNotifier
from memd.daemon.runtime import Runtime
from memd.rpc import RpcServer
from memd.supervision.procs import tree_pss

log = structlog.get_logger()

# Keys that name where memd lives; changing them under a running daemon would strand
# the socket or the data, so such an edit is refused until a restart.
RESTART_KEYS = ("memory_dir", "socket")


class Service(Protocol):
    """A front end memd runs beside its socket (the proxy): started once the socket is up,
    given each applied config, shown under its name in the status, closed first."""

    name: str

    async def start(self, config: Config) -> None: ...

    async def apply(self, config: Config) -> None: ...

    def status(self) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


class Daemon:
    """One running memd: holds the config in force and the services built from it."""

    def __init__(
        self,
        config_path: Path,
        config: Config,
        notifier: SystemdNotifier | None = None,
        services: Sequence[Service] = (),
    ) -> None:
        self.config_path = config_path
        self.notifier = notifier or SystemdNotifier()
        self.started_at = time.time()
        self.config_error: str | None = None
        self.ready = False
        self.server: RpcServer | None = None
        self.runtime = Runtime(config)
        self.services = list(services)
        self._services_started = False
        self._stop = asyncio.Event()
        self._signals = 0
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def config(self) -> Config:
        """The config in force: the runtime's, the one copy there is."""
        return self.runtime.config

    # --- lifecycle ------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGINT/SIGTERM; returns the process exit code."""
        self._install_signal_handlers()
        # Own the socket first: its lock is what keeps a second memd from opening the
        # same session databases. Calls that arrive before the clients are open get a
        # "starting" error rather than waiting.
        self.server = RpcServer(self.config.socket, build_registry(self))
        await self.server.start()
        try:
            await self.apply_config(self.config)
        except BaseException:
            await self.server.close()
            await self.runtime.close()
            raise
        for service in self.services:
            await service.start(self.config)
        self._services_started = True
        self.ready = True
        log.info(
            "memd.ready",
            socket=str(self.config.socket),
            version=__version__,
            clients=len(self.config.enabled_clients()),
        )
        self.notifier.ready(self.status_line())
        self._spawn(self._watch_config(), "config-watch")
        self._spawn(self._poll_config(), "config-poll")
        self._spawn(self.runtime.monitor(), "session-monitor")
        if self.notifier.watchdog_interval:
            self._spawn(self._watchdog(self.notifier.watchdog_interval), "watchdog")
        await self._stop.wait()
        await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        log.info("memd.stopping")
        self.notifier.stopping()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for service in self.services:  # before the socket: their last records go through it
            await service.close()
        if self.server is not None:
            await self.server.close()
        await self.runtime.close()
        log.info("memd.stopped")

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        self._tasks.append(asyncio.create_task(_logged(coro, name), name=name))

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        """Only set a flag; a second SIGINT means the user wants out now."""
        self._signals += 1
        if self._signals > 1 and sig == signal.SIGINT:
            log.warning("memd.forced_exit")
            os._exit(130)
        log.info("memd.signal", signal=sig.name)
        self._stop.set()

    # --- config ---------------------------------------------------------------------

    async def apply_config(self, new: Config) -> None:
        """Bring per-client folders and services in line with `new`."""
        await self.runtime.apply(new)
        if self._services_started:
            for service in self.services:
                await service.apply(new)
        if self.server is not None:  # limits apply to new connections and reads at once
            self.server.max_connections = new.limits.max_connections
            self.server.max_buffered = new.limits.max_buffered_bytes

    async def reload(self) -> bool:
        """Parse -> validate -> diff -> apply; a bad edit keeps the last good config."""
        await _settled(self.config_path)
        try:
            if self.config.source is not None and _blank(self.config_path):
                raise ConfigError(
                    f"{self.config_path}: the config file was deleted or emptied; "
                    "the daemon keeps the last good config (restart memd to "
                    "run on the defaults)"
                )
            new = load_config(self.config_path)
            for key in RESTART_KEYS:
                if getattr(new, key) != getattr(self.config, key):
                    raise ConfigError(
                        f"{self.config_path}: {key}: changing it needs a restart "
                        "of memd; the running daemon keeps the old value"
                    )
        except ConfigError as exc:
            self.config_error = str(exc)
            log.error("config.rejected", error=str(exc))
            self.notifier.status(f"config error: {exc}")
            return False
        # The edit is valid: it stops being "rejected" now, before the runtime starts
        # showing it (status reads the runtime's config while the apply runs).
        self.config_error = None
        if new == self.config:
            return False
        try:
            await self.apply_config(new)
        except Exception as exc:  # never let a reload take the config watcher down
            log.exception("config.apply_failed", path=str(self.config_path))
            self.config_error = f"{self.config_path}: applying the config failed: {exc}"
            return False
        log.info(
            "config.applied", path=str(self.config_path), clients=sorted(new.enabled_clients())
        )
        self.notifier.status(self.status_line())
        return True

    async def _watch_config(self) -> None:
        """Watch the config's folder, not the file: editors save by renaming."""
        folder = self.config_path.parent
        if not folder.is_dir():
            log.warning("config.not_watched", reason="folder does not exist", path=str(folder))
            return
        name = self.config_path.name

        def is_config(change: watchfiles.Change, path: str) -> bool:
            return Path(path).name == name

        # step: watchfiles' thread wakes every `step` ms to look at the stop event; its
        # default of 50 ms made the watcher memd's busiest thread at idle (20 wakeups/s).
        # rust_timeout=0: return only with changes or once stopped, not every 5 s.
        async for _ in watchfiles.awatch(
            folder,
            watch_filter=is_config,
            debounce=1_000,
            step=CONFIG_WATCH_STEP_MS,
            rust_timeout=0,
            stop_event=self._stop,
            recursive=False,
        ):
            await self.reload()

    async def _poll_config(self, interval: float = 2.0) -> None:
        """A slow stat() check behind the watcher: catches an edit made before the
        watcher was set up, or on a filesystem that sends no events."""
        seen = _file_signature(self.config_path)
        await self.reload()  # an edit between loading and watching is not lost
        while True:
            await asyncio.sleep(interval)
            current = _file_signature(self.config_path)
            if current != seen:
                seen = current
                await self.reload()

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    # --- status ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "version": __version__,
            "pid": os.getpid(),
            "state": "running" if self.ready else "starting",
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "rss_bytes": psutil.Process().memory_info().rss,  # memd alone, children below
            **self._footprint(),
            "config_path": str(self.config_path),
            "config_loaded": cfg.source is not None,
            "config_error": self.config_error,
            "socket": str(cfg.socket),
            "memory_dir": str(cfg.memory_dir),
            "compaction": {
                k: v for k, v in self.runtime.compactor.status().items() if k != "clients"
            },
            "zygote": self.runtime.pipelines.zygote_status(),
            "embedder": self.runtime.pipelines.embedder_status(),
            "clients": {cid: self.client_status(cid) for cid in sorted(cfg.clients)},
            **{service.name: service.status() for service in self.services},
        }

    def _footprint(self, every: float = 10.0) -> dict[str, int]:
        """memd and every child it runs, in PSS (see procs.tree_pss); read at most every
        `every` seconds, since smaps of a dozen processes is not free and status is
        polled."""
        now = time.monotonic()
        cached = getattr(self, "_footprint_cache", None)
        if cached is None or now - cached[0] >= every:
            pss, count = tree_pss(os.getpid())
            cached = (now, {"tree_pss_bytes": pss, "tree_processes": count})
            self._footprint_cache = cached
        return cached[1]

    def client_status(self, client_id: str) -> dict[str, Any]:
        client = self.config.clients[client_id]
        return {
            "mode": client.mode,
            "memory_enabled": client.memory_enabled,
            "memory_on": client.memory_on,
            **self.runtime.status(client_id),
        }

    def status_line(self) -> str:
        n = len(self.config.enabled_clients())
        return f"serving {n} client{'s' if n != 1 else ''} on {self.config.socket}"


def _blank(path: Path) -> bool:
    """Missing, or nothing but whitespace: an editor mid-save, or a deleted file."""
    try:
        return not path.read_bytes().strip()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # unreadable: load_config reports it


CONFIG_WATCH_STEP_MS = 1000  # an edit is noticed within about a second
CONFIG_QUIET = 0.3  # seconds a config file must stay unchanged before it is read
CONFIG_SETTLE_LIMIT = 5.0  # a file that never settles is read anyway after this long


async def _settled(
    path: Path, quiet: float = CONFIG_QUIET, limit: float = CONFIG_SETTLE_LIMIT
) -> None:
    """Wait until `path` has stopped changing: an editor or script that writes the file in
    several pieces can leave a prefix that is valid TOML (cut at a line boundary) and that,
    applied, would switch off every client named further down."""
    deadline = time.monotonic() + limit
    seen = _file_signature(path)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        current = _file_signature(path)
        if current == seen:
            return
        seen = current


def _file_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


async def _logged(coro: Awaitable[None], name: str) -> None:
    """Background tasks must not die silently."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("task.crashed", task=name)


def run_daemon(config_path: Path, config: Config, services: Sequence[Service] = ()) -> int:
    """Entry point for `memd run`; `services` are the front ends it runs beside the socket."""
    heap.tune()  # before any thread starts: see memd/heap.py
    heap.sqlite_pages_on_demand()  # before any connection is opened
    before, after = fds.raise_open_files()  # see memd/fds.py; children inherit it
    log.info("memd.open_files", soft_before=before, soft=after)
    os.umask(trust.PRIVATE_UMASK)  # every file memd and its children create: 0600 / 0700
    trust.ensure_memory_dir(config.memory_dir)
    return asyncio.run(Daemon(config_path, config, services=services).run())
