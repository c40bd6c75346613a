"""Watchers on demand: an idle client's `memsearch watch` is stopped and started again on
the first change to its sessions/.

A watcher holds ~40-70 MB and wakes several times a second for nothing while its client
writes nothing. `[supervision] watcher_idle_minutes` (0: never) bounds that: once a
client's sessions/ saw no change for that long and its watcher is RUNNING, the watcher is
parked (`Supervisor.park`: SIGINT, then the state IDLE, which is no failure: no backoff,
no retry count). One `watchfiles` watch over every client's sessions/ sees every write,
memd's own transcript writes and edits made by hand alike, and starts the watcher again
(`Supervisor.start`); a change while the watcher is still stopping starts it once the old
process is gone. Nothing is missed: the restarted watcher's start-up scan indexes every
file whose chunks changed, and the pipeline's catch-up re-checks the files changed since
the last moment all its children ran.

A watcher is parked only when RUNNING (its start-up scan done): at memd's start (and when
a client is enabled) every watcher starts, indexes what changed while memd was down, and
is parked once the idle time has passed since then without a change. The index server
stays up: recall needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
import watchfiles

from memd.supervision import Supervisor
from memd.supervision.states import ProcessStates

log = structlog.get_logger()

# watchfiles' thread wakes every `step` ms to look at its stop event, and (by default)
# returns to the event loop every 5 s even when nothing changed: with rust_timeout=0 it
# returns only with changes or when stopped. A change is seen within about a second,
# under a watcher's start-up; measured, the watch costs memd ~1 wake-up/s (3.6/s with
# step 500 ms and the default timeout).
WATCH_STEP_MS = 1000
MAX_CHECK_EVERY = 30.0  # seconds: the longest sleep between idle checks
IDLE = ProcessStates.IDLE


@dataclass
class _Watched:
    watcher: str  # the supervised child's name
    sessions: Path
    last_change: float  # on the pipeline's clock


class WatchOnDemand:
    """Parks idle clients' watchers and starts them again on a change (see the module)."""

    def __init__(
        self,
        supervisor: Supervisor,
        idle_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.supervisor = supervisor
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._clients: dict[str, _Watched] = {}
        self._changed = asyncio.Event()  # the set of watched folders changed
        self._poke = asyncio.Event()  # a new deadline: look again
        self.wakes = 0  # watchers started on demand (status, tests)
        self._stop: asyncio.Event | None = None  # the running watch's stop event

    @property
    def enabled(self) -> bool:
        return self.idle_seconds > 0

    def add(self, client_id: str, watcher: str, sessions: Path) -> None:
        """Follow a client; its idle time counts from now (a watcher that just started is
        not parked at once: status would flap, and a client being set up is about to
        be used)."""
        self._clients[client_id] = _Watched(watcher, sessions, self._clock())
        self._changed.set()
        self._poke.set()

    def remove(self, client_id: str) -> None:
        if self._clients.pop(client_id, None) is not None:
            self._changed.set()

    def touch(self, client_id: str) -> None:
        """A change in the client's sessions/: its idle time starts again, and an IDLE (or
        stopping) watcher is started."""
        watched = self._clients.get(client_id)
        if watched is None:
            return
        watched.last_change = self._clock()
        self._poke.set()
        name = watched.watcher
        if name not in self.supervisor:
            return
        state = self.supervisor.child(name).state
        if state == IDLE or self.supervisor.child(name).parking:
            log.info("watcher.woken", client=client_id, state=state)
            self.wakes += 1
            self.supervisor.start(name)

    def check(self, now: float | None = None) -> float:
        """Park every RUNNING watcher idle for idle_seconds; returns the seconds until the
        next one may be due (MAX_CHECK_EVERY at most)."""
        now = self._clock() if now is None else now
        wait = MAX_CHECK_EVERY
        if not self.enabled:
            return wait
        for client_id, watched in self._clients.items():
            due = watched.last_change + self.idle_seconds
            if now < due:
                wait = min(wait, due - now)
                continue
            name = watched.watcher
            if name in self.supervisor and self.supervisor.park(name):
                log.info("watcher.parked", client=client_id, idle=round(now - due, 1))
            elif name in self.supervisor and self.supervisor.child(name).state != IDLE:
                wait = min(wait, 1.0)  # not RUNNING yet (starting, failing): look again
        return max(wait, 0.05)

    def close(self) -> None:
        """Stop the watch's thread: it checks its stop event every step, and (with no
        timeout) a cancelled awatch would otherwise wait for the next change."""
        self.idle_seconds = 0.0
        if self._stop is not None:
            self._stop.set()

    def _client_of(self, path: str) -> str | None:
        changed = Path(path)
        for client_id, watched in self._clients.items():
            if changed.is_relative_to(watched.sessions):
                return client_id
        return None

    async def run(self) -> None:
        """The watch and the idle checks, until cancelled; nothing if disabled."""
        if not self.enabled:
            return
        checks = asyncio.create_task(self._check_loop(), name="watchers-idle")
        try:
            while self.enabled:
                self._changed.clear()
                folders = [w.sessions for w in self._clients.values() if w.sessions.is_dir()]
                if not folders:
                    await self._changed.wait()
                    continue
                try:
                    await self._watch(folders)
                except Exception:  # a folder gone under the watch: look again soon
                    log.exception("watcher.on_demand_watch_failed")
                    await asyncio.sleep(1.0)
        finally:
            checks.cancel()
            await asyncio.gather(checks, return_exceptions=True)

    async def _watch(self, folders: list[Path]) -> None:
        """One watchfiles watch over `folders`, until the set of clients changes."""
        stop = self._stop = asyncio.Event()
        waiter = asyncio.create_task(self._changed.wait())
        waiter.add_done_callback(lambda _: stop.set())
        try:
            async for changes in watchfiles.awatch(
                *folders,
                step=WATCH_STEP_MS,
                debounce=WATCH_STEP_MS,
                rust_timeout=0,
                stop_event=stop,
            ):
                for client_id in {self._client_of(path) for _, path in changes}:
                    if client_id is not None:
                        self.touch(client_id)
        finally:
            waiter.cancel()
            self._stop = None

    async def _check_loop(self) -> None:
        while True:
            wait = self.check()
            self._poke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), wait)
