"""A set of named, supervised children: start order, ticking, bounded stop and shutdown.

The per-child state machine is `memd.supervision.child.Child`; real OS effects are
`memd.supervision.procs`. This class adds what concerns several children: which ones are
wanted up, which must be RUNNING before another may (re)start (`requires`: the watcher
waits for its index server), an asyncio loop that ticks them, and bounded stops.

Everything runs on one event loop thread. Spawning must happen on that long-lived thread
(see memd.supervision.procs about PR_SET_PDEATHSIG); never call step() from asyncio.to_thread.

How often `run()` ticks: every `start_tick` seconds while a child is STARTING (each tick
asks its readiness check: how late a RUNNING, and the start of the next child in the chain
zygote -> index server -> watcher, is seen), every `tick` seconds while one is STOPPING,
at once after a start held back by the spawn budget (after letting the loop serve
others), every `idle_tick` seconds while a wanted child waits for a requirement, a gate or
a preference, and every `settled_tick` seconds once all is settled (each child RUNNING,
parked, stopped, FATAL or in backoff: only log housekeeping is left to do); woken earlier
by a child's exit (a pidfd per child, Linux >= 5.3), by `add`/`start`/`reset`/`shutdown`,
or by the next backoff expiring: a killed child is seen at once. Without pidfds neither
`idle_tick` nor `settled_tick` is used.

Who acts on a state change (a catch-up once a watcher is RUNNING again) registers with
`listen` and is handed each `Transition` as it happens, as supervisord's event listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from memd.supervision.child import Child, ChildSpec, ChildStatus, ExitInfo, Spawner
from memd.supervision.exits import HAS_PIDFD, ExitWatch
from memd.supervision.procs import PopenSpawner, reap_leftovers
from memd.supervision.spec import Transition
from memd.supervision.states import WAITING_STATES, ProcessStates

__all__ = ["ChildSpec", "ChildStatus", "ExitInfo", "ProcessStates", "Supervisor", "reap_leftovers"]

log = structlog.get_logger()


class Supervisor:
    """Owns named children; the daemon creates one and runs `run()` as a task."""

    def __init__(
        self,
        *,
        spawner: Spawner | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 0.25,
        poll: float = 0.05,
        prefer_wait: float = 30.0,
        spawn_budget: float | None = None,
        idle_tick: float | None = None,
        start_tick: float | None = None,
        settled_tick: float | None = None,
    ) -> None:
        self._spawner: Spawner = spawner if spawner is not None else PopenSpawner()
        self._clock = clock
        self._tick = tick
        self._start_tick = tick if start_tick is None else min(start_tick, tick)
        self._poll = poll  # how often a waiting stop() looks again
        self._children: dict[str, Child] = {}
        self._requires: dict[str, tuple[str, ...]] = {}
        self._prefers: dict[str, tuple[str, ...]] = {}
        self._gates: dict[str, Callable[[], bool]] = {}
        self._added_at: dict[str, float] = {}
        self._came_up: set[str] = set()  # preferred children that have been RUNNING
        self._prefer_wait = prefer_wait
        self._spawn_budget = spawn_budget  # wall seconds of spawning per tick; None: no limit
        self._idle_tick = idle_tick if idle_tick is not None and HAS_PIDFD else tick
        self._settled_tick = self._idle_tick
        if settled_tick is not None and HAS_PIDFD:
            self._settled_tick = max(settled_tick, self._idle_tick)
        self._wanted: set[str] = set()
        self._closing = False
        self._held_back = False  # the last step left a wanted start for lack of budget
        self._wake: asyncio.Event | None = None  # set by run(): exits, commands
        self._exits = ExitWatch(self._poke)  # while run()s
        self._listeners: list[Callable[[Transition], None]] = []

    # -- membership -----------------------------------------------------------------------

    def add(
        self,
        spec: ChildSpec,
        *,
        requires: Iterable[str] = (),
        start: bool = True,
        prefers: Iterable[str] = (),
        gate: Callable[[], bool] | None = None,
    ) -> Child:
        """Register a child; with start=True it is spawned on the next step once every
        child named in `requires` is RUNNING (a missing one counts as not RUNNING) and
        `gate()`, if given, is true (cheap and non-blocking, like a ready check: memd's
        shared index server gates a watcher on its own client's socket).

        `prefers` is softer: the child waits for those only until they first reach
        RUNNING, at most prefer_wait seconds after they were added, and not at all once
        they failed (BACKOFF, FATAL). The zygote is preferred this way: children started
        before it is up would be spawned the slow way."""
        if spec.name in self._children:
            raise ValueError(f"child {spec.name!r} already exists")
        child = Child(spec, self._spawner)
        child.on_change = self._emit
        self._children[spec.name] = child
        self._requires[spec.name] = tuple(requires)
        self._prefers[spec.name] = tuple(prefers)
        if gate is not None:
            self._gates[spec.name] = gate
        self._added_at[spec.name] = self._clock()
        if start:
            self._wanted.add(spec.name)
            self._poke()
        return child

    async def remove(self, name: str, timeout: float | None = None) -> bool:
        """Stop the child (bounded) and forget it. False if it did not stop in time."""
        stopped = await self.stop(name, timeout)
        self._children.pop(name, None)
        self._requires.pop(name, None)
        self._prefers.pop(name, None)
        self._gates.pop(name, None)
        self._added_at.pop(name, None)
        self._came_up.discard(name)
        self._wanted.discard(name)
        return stopped

    async def replace(
        self,
        spec: ChildSpec,
        *,
        requires: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> Child:
        """Apply a (possibly) changed spec, as a config reload does: an equal spec and
        requires leave the running process alone; otherwise await the old process's stop,
        then start the new one. An unknown name is simply added."""
        old = self._children.get(spec.name)
        old_requires = self._requires.get(spec.name, ())
        new_requires = old_requires if requires is None else tuple(requires)
        if old is not None and old.spec == spec and new_requires == old_requires:
            return old
        wanted = old is None or spec.name in self._wanted
        prefers = self._prefers.get(spec.name, ())
        gate = self._gates.get(spec.name)
        if old is not None:
            await self.remove(spec.name, timeout)
        return self.add(spec, requires=new_requires, start=wanted, prefers=prefers, gate=gate)

    def __contains__(self, name: object) -> bool:
        return name in self._children

    def names(self) -> list[str]:
        return list(self._children)

    def child(self, name: str) -> Child:
        return self._children[name]

    # -- commands -------------------------------------------------------------------------

    def start(self, name: str) -> None:
        """Want it up: spawned on the next step (after any stop in progress completed)."""
        if name not in self._children:
            raise KeyError(name)
        self._wanted.add(name)
        self._poke()

    async def stop(self, name: str, timeout: float | None = None) -> bool:
        """Stop and wait until it has exited (bounded by its own stop_timeout+kill_timeout,
        and by `timeout` if given). True if it is idle afterwards."""
        child = self._children[name]
        self._wanted.discard(name)
        child.stop(self._clock())
        return await self._wait_idle([child], timeout)

    async def restart(self, name: str, timeout: float | None = None) -> bool:
        """`await stop()` then `start()`: the new process never overlaps the old one."""
        stopped = await self.stop(name, timeout)
        if stopped:
            self.start(name)
        return stopped

    def park(self, name: str) -> bool:
        """Stop a RUNNING child because its work is idle: it ends IDLE, and `start()` (on
        demand) brings it back. False if it was not RUNNING (it keeps its own rules)."""
        if not self._children[name].park(self._clock()):
            return False
        self._wanted.discard(name)
        self._poke()
        return True

    def reset(self, name: str) -> bool:
        """Give a FATAL child a fresh retry budget and want it up again."""
        child = self._children[name]
        if not child.reset():
            return False
        self._wanted.add(name)
        self._poke()
        return True

    def is_ready(self, name: str) -> bool:
        """RUNNING: up startsecs and its readiness check passed."""
        child = self._children.get(name)
        return child is not None and child.state == ProcessStates.RUNNING

    async def wait_ready(self, name: str, timeout: float) -> bool:
        """Wait (ticking) until the child is RUNNING, FATAL, or timeout passed."""
        deadline = self._clock() + timeout
        while True:
            self.step()
            child = self._children.get(name)
            if child is None or child.state == ProcessStates.FATAL:
                return False
            if child.state == ProcessStates.RUNNING:
                return True
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(self._poll)

    def listen(self, listener: Callable[[Transition], None]) -> None:
        """Call `listener` with every state change of every child, as it happens (on the
        loop thread, inside the step or command that made it). It must be cheap and must
        not change a child's state itself: set an event, create a task."""
        self._listeners.append(listener)

    def _emit(self, transition: Transition) -> None:
        for listener in self._listeners:
            try:
                listener(transition)
            except Exception:  # one listener's bug must not break the state machine
                log.exception("supervisor.listener_failed", transition=transition)

    # -- ticking --------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        """One tick for every child: starts wanted ones, lets each make its timing decisions.

        Spawns block the loop (a fork from the zygote takes 50-300 ms on a loaded box), so
        once a tick has spent spawn_budget seconds on them (if set; memd's pipelines set
        it) the rest wait for the next tick; every child is still polled."""
        now = self._clock() if now is None else now
        budget = self._spawn_budget
        budget_end = time.monotonic() + budget if budget is not None else float("inf")
        self._held_back = False
        for name, child in list(self._children.items()):
            wanted = (
                name in self._wanted
                and self._requirements_running(name)
                and self._preferences_settled(name, now)
            )
            may_start = wanted and time.monotonic() < budget_end
            self._held_back |= wanted and not may_start and self._would_spawn(child, now)
            if may_start and child.state in (ProcessStates.STOPPED, ProcessStates.IDLE):
                self._guarded(child, child.start, now)
            self._guarded(child, child.step, now, can_spawn=may_start)
            if may_start and child.state == ProcessStates.IDLE:  # woken while it stopped
                self._guarded(child, child.start, now)

    @staticmethod
    def _would_spawn(child: Child, now: float) -> bool:
        if child.state in (ProcessStates.STOPPED, ProcessStates.IDLE):
            return True
        due = child.next_start_at
        return child.state in WAITING_STATES and due is not None and now >= due

    async def run(self) -> None:
        """Tick until shutdown() (or cancellation): see the module docstring for when."""
        self._wake = asyncio.Event()
        try:
            while not self._closing:
                self.step()
                self._watch_exits()
                await self._sleep(self._next_tick())
        finally:
            self._exits.drop()
            self._wake = None

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _next_tick(self) -> float:
        """Seconds until the next step is needed (see the module docstring)."""
        if self._held_back:
            return 0.0
        states = {child.state for child in self._children.values()}
        if ProcessStates.STARTING in states:
            return self._start_tick
        if ProcessStates.STOPPING in states:
            return self._tick
        settled = all(c.settled(n in self._wanted) for n, c in self._children.items())
        wait = self._settled_tick if settled else self._idle_tick
        now = self._clock()
        for child in self._children.values():
            due = child.next_start_at
            if child.state in WAITING_STATES and due is not None:
                # due already but held by a requirement: look again at the normal tick
                wait = min(wait, due - now if due > now else self._tick)
        return max(wait, 0.0)

    async def _sleep(self, seconds: float) -> None:
        wake = self._wake
        if seconds <= 0 or wake is None:
            await asyncio.sleep(max(seconds, 0.0))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), seconds)
        wake.clear()

    def _watch_exits(self) -> None:
        """One pidfd per live child, read by the loop: its exit wakes run() at once."""
        if HAS_PIDFD and self._settled_tick > self._tick:
            self._exits.follow(
                {n: c.proc.pid for n, c in self._children.items() if c.proc is not None}
            )

    async def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop every child in parallel. At 3/4 of timeout whatever is left gets SIGKILL;
        returns False if something is still alive at timeout. Ends run()."""
        self._closing = True
        self._poke()  # run() may sleep until a far-off backoff: let it see the end now
        self._wanted.clear()
        children = list(self._children.values())
        now = self._clock()
        for child in children:
            child.stop(now)
        if await self._wait_idle(children, timeout * 0.75):
            return True
        now = self._clock()
        for child in children:
            if not child.idle:
                child.kill(now)
        ok = await self._wait_idle(children, timeout * 0.25)
        if not ok:
            log.error(
                "daemon.children_survived",
                names=[c.spec.name for c in children if not c.idle],
            )
        return ok

    async def _wait_idle(self, children: list[Child], timeout: float | None) -> bool:
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            now = self._clock()
            for child in children:
                self._guarded(child, child.step, now, can_spawn=False)
            if all(child.idle for child in children):
                return True
            if deadline is not None and now >= deadline:
                return False
            await asyncio.sleep(self._poll)

    @staticmethod
    def _guarded(child: Child, method: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """One child's trouble (a bug, a failing seam) must not stop the others' supervision."""
        try:
            method(*args, **kwargs)
        except Exception:
            log.exception("child.supervise_failed", name=child.spec.name, state=child.state)

    def _requirements_running(self, name: str) -> bool:
        if not all(self.is_ready(req) for req in self._requires.get(name, ())):
            return False
        gate = self._gates.get(name)
        if gate is None:
            return True
        # Only before a (re)start: a gate that connects to a socket must not wake its
        # server on every idle tick.
        state = self._children[name].state
        return state not in (ProcessStates.STOPPED, ProcessStates.IDLE, *WAITING_STATES) or gate()

    def _preferences_settled(self, name: str, now: float) -> bool:
        for pref in self._prefers.get(name, ()):
            child = self._children.get(pref)
            if child is None or pref in self._came_up or pref not in self._wanted:
                continue
            if child.state == ProcessStates.RUNNING:
                self._came_up.add(pref)
                continue
            pending = child.state in (ProcessStates.STOPPED, ProcessStates.STARTING)
            if pending and now < self._added_at[pref] + self._prefer_wait:
                return False
        return True

    # -- status ---------------------------------------------------------------------------

    def child_status(self, name: str) -> ChildStatus | None:
        child = self._children.get(name)
        return child.status(self._clock()) if child is not None else None

    def status(self) -> dict[str, ChildStatus]:
        now = self._clock()
        return {name: child.status(now) for name, child in self._children.items()}
