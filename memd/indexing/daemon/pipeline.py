"""Each client's indexing pipeline under the supervisor: index server, watcher, searcher.

`Pipelines` turns the config into supervised children: per enabled client its plan
(`ClientPlan`, derived once from the client and the config), an index server (local mode
only, from the `IndexServers` chosen once at start: one per client or one shared) and a
`memsearch watch` that starts once the index server answers, plus the `IndexSearcher`
recall uses. One embedder child holds the bundled models for every watcher (over its
socket, memsearch's `memd` provider) and recall (`memd.indexing.daemon.embedder`).
Catch-ups after restarts: `memd.indexing.daemon.catch_ups`. A change of a client's index
settings (embedding provider/model, Milvus target) stops its children, rebuilds the
index from the markdown files if the fingerprint changed, and starts them again;
anything else leaves running children alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from memd.config import Config
from memd.indexing.daemon import leftovers, maintenance
from memd.indexing.daemon.catch_ups import CATCH_UP_MARGIN, CatchUp, CatchUps
from memd.indexing.daemon.embedder import EMBEDDER_NAME, EmbeddingService
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.servers import (
    IndexServers,
    OwnServers,
    Served,
    add_client_child,
    index_servers,
)
from memd.indexing.daemon.settings import ensure_dirs
from memd.indexing.daemon.watch_on_demand import WatchOnDemand
from memd.indexing.daemon.zygote import ZYGOTE_MODULES, start_zygote, zygote_status
from memd.indexing.query.search import IndexSearcher
from memd.indexing.targets import Endpoint, uses_embedded_model
from memd.layout import ClientLayout, write_memsearch_toml
from memd.supervision import Supervisor
from memd.supervision.zygote_spawner import ZYGOTE_NAME, ZygoteSpawner

log = structlog.get_logger()

SPAWN_BUDGET = 0.2  # seconds a supervisor tick may spend spawning (forks block the loop)
IDLE_TICK = 1.0  # seconds between supervisor ticks while a child waits to start
# seconds between ticks once every child is RUNNING, parked or failed for good: exits and
# commands wake it at once, so this only paces log housekeeping (child.HOUSEKEEP_EVERY)
SETTLED_TICK = 10.0
# seconds between ticks while a child starts: each asks its readiness check, so this is how
# late a RUNNING (and the next child's start behind it) can be seen
START_TICK = 0.1


@dataclass
class _Pipeline:
    plan: ClientPlan
    config: Config
    endpoint: Endpoint | None
    fingerprint: tuple[Any, ...]
    served: Served | None  # its index server (None: a remote Milvus server)
    watcher: str
    searcher: IndexSearcher
    catch_up: CatchUp = field(default_factory=CatchUp)  # `memd.indexing.daemon.catch_ups`

    @property
    def layout(self) -> ClientLayout:
        return self.plan.layout

    @property
    def children(self) -> list[str]:
        """Its index server (when local) and watcher, in start order."""
        return ([self.served.name] if self.served else []) + [self.watcher]

    @property
    def needs(self) -> list[str]:
        """What must run for its indexing: its children and, for an embedded model, the
        embedder (a restart of either is caught up after)."""
        return self.children + ([EMBEDDER_NAME] if self.endpoint is not None else [])


def _fingerprint(config: Config) -> tuple[Any, ...]:
    """What, when changed, needs the client's children restarted (and maybe a rebuild)."""
    return (config.embedding, config.milvus)


class Pipelines:
    """Owns the supervisor, the embedder and its endpoint, and every client's pipeline."""

    def __init__(self, supervisor: Supervisor | None = None) -> None:
        # The zygote forks the children when memd builds its own supervisor; a supervisor
        # handed in (tests) keeps its own spawner.
        self.spawner: ZygoteSpawner | None = None
        if supervisor is None:
            self.spawner = ZygoteSpawner(modules=ZYGOTE_MODULES)
            supervisor = Supervisor(
                spawner=self.spawner,
                spawn_budget=SPAWN_BUDGET,
                idle_tick=IDLE_TICK,
                start_tick=START_TICK,
                settled_tick=SETTLED_TICK,
            )
            self.spawner.zygote_ready = lambda: self.supervisor.is_ready(ZYGOTE_NAME)
        self.supervisor = supervisor
        self._pipelines: dict[str, _Pipeline] = {}
        self._errors: dict[str, str] = {}  # clients whose pipeline could not be set up
        # One embedder child for every watcher's texts and every client's queries.
        self.embedding = EmbeddingService(self.supervisor, self._prefers)
        self._task: asyncio.Task[None] | None = None
        self._catch_up_task: asyncio.Task[None] | None = None
        # Catch-ups, started by the supervisor's transitions of the children they need.
        self.catch_ups = CatchUps(self.supervisor, self._pipelines, self.spawner)
        self.supervisor.listen(self.catch_ups.on_transition)
        # A server per client until `start` reads [supervision] shared_index_server.
        self._servers: IndexServers = OwnServers(self.supervisor, self._prefers)
        self.on_demand = WatchOnDemand(self.supervisor, 0.0)  # set up by start()
        self._on_demand_task: asyncio.Task[None] | None = None

    async def start(self, config: Config) -> None:
        """Reap what a crashed memd left behind, then start ticking the supervisor.

        Only configured clients' folders are looked at, only if they pass the trust rule,
        and only children memd starts for that client are stopped
        (`memd.indexing.daemon.leftovers`): a pidfile is readable data anyone could have
        written. The index servers' kind is chosen here, once (`servers.index_servers`).
        """
        await leftovers.reap_memd_wide(config.memory_dir)
        if self.spawner is not None:
            # first, so it imports while the rest starts; on the loop: spawns happen there
            start_zygote(
                self.supervisor, self.spawner, config.memory_dir, config.supervision.zygote
            )
            self.supervisor.step()
        self._servers = index_servers(config, self.supervisor, self._prefers, self._restart)
        for client_id in sorted(config.clients):
            await leftovers.reap_client(config, ClientLayout(config.memory_dir, client_id))
        self._task = asyncio.create_task(self.supervisor.run(), name="supervisor")
        self.on_demand.idle_seconds = config.supervision.watcher_idle_minutes * 60
        self._on_demand_task = asyncio.create_task(self.on_demand.run(), name="on-demand")
        self._catch_up_task = asyncio.create_task(self.catch_ups.run(), name="catch-up")

    def zygote_status(self) -> dict[str, Any] | None:
        """daemon.status's `zygote`: the child's status plus how children were started."""
        return zygote_status(self.supervisor, self.spawner)

    def embedder_status(self) -> dict[str, Any] | None:
        """daemon.status's `embedder`: the child's status, None when none is run."""
        return self.embedding.status()

    def _prefers(self) -> tuple[str, ...]:
        return (ZYGOTE_NAME,) if ZYGOTE_NAME in self.supervisor else ()

    def wake(self, client_id: str) -> None:
        """The client's sessions/ changed: restart its idle time, start a parked watcher."""
        self.on_demand.touch(client_id)

    def searcher(self, client_id: str) -> IndexSearcher | None:
        pipeline = self._pipelines.get(client_id)
        return pipeline.searcher if pipeline else None

    async def apply(self, config: Config) -> None:
        """Start, restart or stop client pipelines so they match `config`."""
        wanted = config.enabled_clients()
        for client_id in sorted(set(self._pipelines) - set(wanted)):
            await self._stop(client_id)
        for client_id in set(self._errors) - set(wanted):
            del self._errors[client_id]
        for client_id in sorted(wanted):
            current = self._pipelines.get(client_id)
            if current is not None and current.fingerprint == _fingerprint(config):
                continue
            if current is not None:
                await self._stop(client_id)
            try:
                await self._start(config, ClientLayout(config.memory_dir, client_id))
                self._errors.pop(client_id, None)
            except Exception as exc:  # one client's broken folder must not stop the rest
                log.exception("pipeline.start_failed", client=client_id)
                self._errors[client_id] = f"{type(exc).__name__}: {exc}"
        if not wanted or not uses_embedded_model(config.embedding):
            await self.embedding.stop()

    async def _start(self, config: Config, layout: ClientLayout) -> None:
        plan = ClientPlan.of(config, layout)
        endpoint = await self.embedding.endpoint(config)
        await asyncio.to_thread(ensure_dirs, layout)
        await asyncio.to_thread(write_memsearch_toml, layout, dict(plan.memsearch_toml))
        if await asyncio.to_thread(maintenance.prepare, plan):
            log.info("pipeline.index_rebuilt", client=plan.client_id)
        served = await self._servers.add(plan) if plan.index_server is not None else None
        watcher = add_client_child(
            self.supervisor,
            plan,
            "watch",
            plan.watcher(endpoint),
            self._watching(f"{plan.client_id}/watch", layout.sessions),
            requires=(served.requires if served else ()) + self.embedding.requires,
            prefers=self._prefers(),
            gate=served.gate if served else None,
        )
        self.on_demand.add(plan.client_id, watcher, layout.sessions)
        searcher = IndexSearcher(
            plan.target, config.embedding, root=layout.root, embedder=self.embedding.query_client
        )
        pipeline = _Pipeline(
            plan, config, endpoint, _fingerprint(config), served, watcher, searcher
        )
        pipeline.catch_up.since = time.time() - CATCH_UP_MARGIN
        self._pipelines[plan.client_id] = pipeline
        log.info("pipeline.started", client=plan.client_id, children=pipeline.children)

    def _watching(self, name: str, sessions: Path) -> Callable[[], bool]:
        """Ready once memsearch really watches sessions/ (its log line comes too early)."""

        def ready() -> bool:
            proc = self.supervisor.child(name).proc
            return proc is not None and maintenance.watcher_ready(proc.pid, sessions)

        return ready

    async def _stop(self, client_id: str) -> None:
        pipeline = self._pipelines.pop(client_id)
        self.on_demand.remove(client_id)
        # Watcher first: it must not lose its index server in the middle of a write.
        await self.supervisor.remove(pipeline.watcher)
        if pipeline.served is not None:
            await self._servers.remove(pipeline.plan, pipeline.served)
        await asyncio.to_thread(pipeline.searcher.close)
        log.info("pipeline.stopped", client=client_id)

    async def _restart(self, client_ids: Sequence[str]) -> None:
        """Stop and start these clients' pipelines (the shared index server went FATAL:
        they get a server each)."""
        for client_id in client_ids:
            pipeline = self._pipelines.get(client_id)
            if pipeline is not None:
                await self._stop(client_id)
                await self._start(pipeline.config, pipeline.layout)

    async def rebuild(self, client_id: str, timeout: float = 120.0) -> bool:
        """Drop the client's index and build it again from the markdown files.

        For `memory.forget`: Milvus Lite keeps deleted rows in its segment files until a
        compaction, so the only way to make sure removed text is gone from `.memsearch/`
        is to drop the data and let the restarted watcher index what is left. Recall
        answers `index_unavailable` meanwhile; this returns once the new watcher has indexed
        what is left (or after `timeout`). False when the client has no pipeline.
        """
        pipeline = self._pipelines.get(client_id)
        if pipeline is None:
            return False
        await self._stop(client_id)
        await asyncio.to_thread(maintenance.rebuild, pipeline.layout, pipeline.plan.target)
        await self._start(pipeline.config, pipeline.layout)
        await self._until_ready(client_id, timeout)
        log.info("pipeline.rebuilt", client=client_id)
        return True

    async def _until_ready(self, client_id: str, timeout: float) -> None:
        """Wait (bounded) until the client's children run again: the watcher is ready only
        after its initial scan, so the index then holds every file again."""
        pipeline = self._pipelines.get(client_id)
        deadline = time.monotonic() + timeout
        while pipeline is not None and time.monotonic() < deadline:
            if all(self.supervisor.is_ready(name) for name in pipeline.children):
                return
            await asyncio.sleep(0.1)

    def reset(self, client_id: str) -> bool:
        """Take a client's FATAL children out of FATAL and start them again."""
        pipeline = self._pipelines.get(client_id)
        if pipeline is None:
            return False
        retried = self._servers.retry(client_id)
        return any([self.supervisor.reset(name) for name in pipeline.children]) or retried

    def status(self, client_id: str) -> dict[str, Any]:
        pipeline = self._pipelines.get(client_id)
        if pipeline is None:
            error = self._errors.get(client_id)
            return {"pipeline_error": error} if error else {}
        # This client's children only: the status of all of them, once per client, made
        # daemon.status quadratic in the number of clients (seconds at 20).
        out: dict[str, Any] = {}
        for name in pipeline.children:
            key = "index_server" if name.endswith("/index") else "watcher"
            child = self.supervisor.child_status(name)
            out[key] = child.to_dict() if child is not None else None
        error = self._servers.client_error(client_id)
        if error is not None and out.get("index_server"):
            # the shared process runs, but this client's database did not open
            out["index_server"] |= {"state": "FATAL", "last_error": error}
        return out

    async def close(self, timeout: float = 10.0) -> None:
        """Stop every child within `timeout`, then the embedder."""
        self.on_demand.close()
        for task in (self._catch_up_task, self._on_demand_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._servers.close()
        await self.supervisor.shutdown(timeout)
        if self.spawner is not None:
            self.spawner.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for pipeline in self._pipelines.values():
            await asyncio.to_thread(pipeline.searcher.close)
        self._pipelines.clear()
        await self.embedding.stop()
