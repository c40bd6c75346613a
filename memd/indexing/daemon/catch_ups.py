"""When a client's pipeline catches up, driven by its children's state transitions.

memsearch's watcher skips files written between its initial scan and the start of its
observer, and a watcher that outlived its index server lost the events of the outage. A
catch-up child (`memd.indexing.daemon.catch_up_run`) re-indexes the files changed since the
last good moment with the watcher's own settings (unchanged chunks are not embedded
twice).

What starts one is a transition (`Supervisor.listen`, as supervisord's PROCESS_STATE
events): a child the pipeline needs (its index server, its watcher, the embedder) reached
RUNNING with a pid it was not caught up with. When one of them leaves RUNNING while the
pipeline was caught up with exactly these processes, that moment (minus
CATCH_UP_MARGIN) becomes the `since` of the catch-up after the restart; a catch-up under
way is abandoned. Nothing polls: memd used to look every 2 s (a wake-up of its event
loop every 2 s at idle) and compared pid tuples to see whether anything had restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from memd.indexing.daemon import catch_up_run
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.targets import Endpoint
from memd.supervision.spec import Transition
from memd.supervision.states import ProcessStates

if TYPE_CHECKING:
    from memd.supervision import Supervisor
    from memd.supervision.child import Spawner

log = structlog.get_logger()

CATCH_UP_MARGIN = 5.0  # seconds of mtime slack: clocks and writes around a restart
CATCH_UP_RETRY = 10.0  # seconds before a failed catch-up is tried again


@dataclass
class CatchUp:
    """One pipeline's catch-up bookkeeping."""

    caught_up: tuple[int | None, ...] = ()  # the pids of its `needs` last caught up
    since: float = 0.0  # files changed from then on are re-checked after a (re)start
    # Set when one of its children leaves RUNNING: a catch-up under way is abandoned.
    left: asyncio.Event = field(default_factory=asyncio.Event)


class Pipeline(Protocol):
    """What a catch-up needs of a client's pipeline (`pipeline._Pipeline`)."""

    plan: ClientPlan
    endpoint: Endpoint | None
    catch_up: CatchUp

    @property
    def children(self) -> list[str]: ...

    @property
    def needs(self) -> list[str]: ...


class CatchUps:
    """Runs every pipeline's catch-ups, one at a time, as transitions ask for them."""

    def __init__(
        self,
        supervisor: Supervisor,
        pipelines: Mapping[str, Pipeline],
        spawner: Spawner | None,
    ) -> None:
        self.supervisor = supervisor
        self._pipelines = pipelines  # the live mapping: pipelines come and go
        self._spawner = spawner
        self._due = asyncio.Event()  # a needed child reached RUNNING: look

    def on_transition(self, change: Transition) -> None:
        """`Supervisor.listen`er: see the module docstring."""
        for pipeline in self._pipelines.values():
            if change.name not in pipeline.needs:
                continue
            if change.new == ProcessStates.RUNNING:
                self._due.set()
            elif change.old == ProcessStates.RUNNING:
                state = pipeline.catch_up
                # the leaving child still has its process here: the key is the old one
                if self._pids(pipeline) == state.caught_up:
                    state.since = time.time() - CATCH_UP_MARGIN
                if change.name in pipeline.children:
                    state.left.set()

    async def run(self) -> None:
        """Until cancelled: catch up whatever a transition asked for, and retry a failed
        catch-up after CATCH_UP_RETRY (no timer runs while nothing changes)."""
        retry: float | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), retry)
            self._due.clear()
            retry = None
            for client_id, pipeline in list(self._pipelines.items()):
                try:
                    await self._catch_up(client_id, pipeline)
                except Exception:
                    log.exception("pipeline.catch_up_failed", client=client_id)
                    retry = CATCH_UP_RETRY

    def _pids(self, pipeline: Pipeline) -> tuple[int | None, ...]:
        """The pids of what the pipeline needs, in order (None: no process)."""
        pids = []
        for name in pipeline.needs:
            proc = self.supervisor.child(name).proc if name in self.supervisor else None
            pids.append(proc.pid if proc is not None else None)
        return tuple(pids)

    async def _catch_up(self, client_id: str, pipeline: Pipeline) -> None:
        if not all(self.supervisor.is_ready(name) for name in pipeline.needs):
            return  # not all up: their RUNNING comes; `since` keeps the last good moment
        key = self._pids(pipeline)
        state = pipeline.catch_up
        if key == state.caught_up:
            return
        # In a child (forked from the zygote when it runs), not in memd: memsearch's
        # indexing would cost memd pymilvus (~90 MB) and GIL time beside recall.
        state.left.clear()
        run = catch_up_run.run_plan(pipeline.plan, pipeline.endpoint, state.since, self._spawner)
        added = await self._while_up(state, run)
        if added is None:
            log.info("pipeline.catch_up_abandoned", client=client_id)
            return
        if self._pipelines.get(client_id) is pipeline:
            state.caught_up = key
        if added:
            log.info("pipeline.caught_up", client=client_id, chunks=added)

    @staticmethod
    async def _while_up(state: CatchUp, run: Coroutine[Any, Any, int]) -> int | None:
        """The catch-up's chunks, or None if one of the client's children left RUNNING
        first (`state.left`): then the catch-up child is killed (cancelling `run` does
        that). It holds the client's index lock, and a restarted watcher's start-up scan
        waited for it (a kill -9'd watcher was back after ~1.5 s instead of ~0.3 s); that
        scan indexes what changed, and a catch-up from the same `since` follows its start."""
        task = asyncio.ensure_future(run)
        left = asyncio.ensure_future(state.left.wait())
        try:
            await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
            return task.result() if task.done() else None
        finally:
            for pending in (task, left):
                if not pending.done():
                    pending.cancel()
            await asyncio.gather(task, left, return_exceptions=True)
