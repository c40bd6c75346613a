"""Where a client's local index is served from: one seam, two implementations.

`Pipelines` asks its `IndexServers` for each local client's index server and never asks
which kind it has. The kind is chosen once, from `[supervision] shared_index_server`,
when memd starts (as uvicorn picks its supervisor once, `index_servers`):

- `OwnServers`: a supervised `<client>/index` child per client (the default);
- `SharedServers`: the one `_shared/index` child for every client
  (`memd.indexing.daemon.shared_index`); the client's watcher is also gated on its own
  socket answering. If the shared child goes FATAL, it hands its clients to an `OwnServers` for
  good, and `on_fatal` restarts their pipelines so each gets a server of its own.

Also here: how a client's supervised child is specified (`add_client_child`), for the
index server and the watcher alike.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from memd.config import Config
from memd.indexing.children import index_ready
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.settings import Command
from memd.indexing.daemon.shared_index import SHARED_NAME, SharedIndex
from memd.supervision import ChildSpec, Supervisor, procs

FATAL_RETRY_AFTER = 600.0  # seconds a FATAL watcher or index server waits, then retries

Prefers = Callable[[], tuple[str, ...]]  # the children a new child is best started from


@dataclass(frozen=True)
class Served:
    """A client's index server as its watcher and `daemon.status` see it."""

    name: str  # the supervised child whose state is the client's `index_server`
    requires: tuple[str, ...]  # children the watcher requires running
    gate: Callable[[], bool] | None = None  # what must hold before the watcher starts


class IndexServers(Protocol):
    """Serves local clients' indexes; `Pipelines` holds one, chosen once from the config."""

    async def add(self, plan: ClientPlan) -> Served:
        """Serve the client's index (its plan has an `index_server`)."""
        ...

    async def remove(self, plan: ClientPlan, served: Served) -> None:
        """Stop serving it; the index files are closed when this returns."""
        ...

    async def close(self) -> None:
        """Stop the implementation's own tasks (the supervisor stops the children)."""
        ...

    def client_error(self, client_id: str) -> str | None:
        """Why the client's index is not served although its server runs, if it is not."""
        ...

    def retry(self, client_id: str) -> bool:
        """Try that client again soon (`clients.reset`); False if it had not failed."""
        ...


def index_servers(
    config: Config,
    supervisor: Supervisor,
    prefers: Prefers,
    on_fatal: Callable[[Sequence[str]], Awaitable[None]],
) -> IndexServers:
    """The implementation the config asks for."""
    if config.supervision.shared_index_server:
        return SharedServers(supervisor, config, prefers, on_fatal)
    return OwnServers(supervisor, prefers)


class OwnServers:
    """A supervised index server per client (`<client>/index`)."""

    def __init__(self, supervisor: Supervisor, prefers: Prefers) -> None:
        self.supervisor = supervisor
        self._prefers = prefers

    async def add(self, plan: ClientPlan) -> Served:
        assert plan.index_server is not None, "a remote index has no index server"
        serving = functools.partial(index_ready, plan.index_socket, timeout=0.2)
        name = add_client_child(
            self.supervisor, plan, "index", plan.index_server, serving, prefers=self._prefers()
        )
        return Served(name, requires=(name,))

    async def remove(self, plan: ClientPlan, served: Served) -> None:
        await self.supervisor.remove(served.name)

    async def close(self) -> None:
        return None

    def client_error(self, client_id: str) -> str | None:
        return None  # its own child's state and last error say it

    def retry(self, client_id: str) -> bool:
        return False  # the supervisor resets its own child


class SharedServers:
    """The one shared index server, then a server per client once it went FATAL."""

    def __init__(
        self,
        supervisor: Supervisor,
        config: Config,
        prefers: Prefers,
        on_fatal: Callable[[Sequence[str]], Awaitable[None]],
    ) -> None:
        self._own = OwnServers(supervisor, prefers)
        self._on_fatal = on_fatal
        self.shared = SharedIndex(
            supervisor, config.memory_dir, prefers=prefers, on_fatal=self._fall_back
        )

    async def add(self, plan: ClientPlan) -> Served:
        if self.shared.failed:
            return await self._own.add(plan)
        name = await self.shared.add(plan.client_id, plan.data_dir, plan.index_socket)
        return Served(name, requires=(name,), gate=self.shared.serving(plan.index_socket))

    async def remove(self, plan: ClientPlan, served: Served) -> None:
        if served.name == SHARED_NAME:
            await self.shared.remove(plan.client_id)
        else:
            await self._own.remove(plan, served)

    async def _fall_back(self) -> None:
        """The shared child went FATAL (and is removed): give its clients a server each."""
        await self._on_fatal(self.shared.clients)

    async def close(self) -> None:
        await self.shared.close()

    def client_error(self, client_id: str) -> str | None:
        return None if self.shared.failed else self.shared.client_errors.get(client_id)

    def retry(self, client_id: str) -> bool:
        return self.shared.retry(client_id)


def add_client_child(
    supervisor: Supervisor,
    plan: ClientPlan,
    kind: str,
    command: Command,
    ready: Callable[[], bool],
    *,
    requires: Sequence[str] = (),
    prefers: tuple[str, ...] = (),
    gate: Callable[[], bool] | None = None,
) -> str:
    """Supervise one of the client's children (`index` or `watch`); returns its name.

    RUNNING comes with readiness (the index server's socket answers, the watcher holds
    its inotify watch), so no fixed startsecs; the first exit after a healthy run is
    restarted at once (see memd.supervision.child)."""
    layout = plan.layout
    name = f"{layout.client_id}/{kind}"
    supervisor.add(
        ChildSpec(
            name=name,
            argv=command.argv,
            env=dict(command.env),
            cwd=command.cwd,
            log_path=layout.logs_dir / f"{kind}.log",
            pidfile=layout.state_dir / f"{kind}.pid",
            startsecs=0.0,
            stop_signal=signal.SIGINT,
            stop_timeout=10.0,
            ready=ready,
            # An initial scan of a large session takes minutes: busy is not stuck.
            progress=procs.activity,
            # FATAL is a pause: a client's indexing never stops for good.
            fatal_retry_after=FATAL_RETRY_AFTER,
            restart_at_once=True,
        ),
        requires=requires,
        prefers=prefers,
        gate=gate,
    )
    return name
