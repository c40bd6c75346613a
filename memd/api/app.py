"""What the method table needs from the daemon, as protocols: a runtime and a status.

The api sees only this face, so it never imports the daemon (the import contract in
pyproject.toml checks that), and tests can hand it any object of this shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from memd.config import Config
from memd.indexing import IndexSearcher
from memd.layout import ClientLayout
from memd.privacy import Selector
from memd.recall import RecallLane
from memd.rpc import JsonParams
from memd.sessions import ClientSessions


class ClientServices(Protocol):
    """One client's services in force."""

    layout: ClientLayout
    sessions: ClientSessions
    recall_lane: RecallLane  # the client's own search threads

    @property
    def searcher(self) -> IndexSearcher | None: ...

    def wrote(self) -> None:
        """memd wrote to the client's sessions/: its index should follow now."""


class Services(Protocol):
    """The per-client services in force and the one config they follow."""

    config: Config

    async def client(self, client_id: str) -> ClientServices: ...

    def reset(self, client_id: str) -> bool: ...

    async def list_sessions(self, client_id: str) -> list[dict[str, Any]]: ...

    async def recompact(self, client_id: str, session_id: str | None) -> list[dict[str, Any]]: ...

    async def forget(
        self, client_id: str, selector: Selector, dry_run: bool = False
    ) -> dict[str, Any]: ...

    async def redact(
        self, client_id: str, only: list[str] | None, dry_run: bool, rebuild: bool | None = None
    ) -> dict[str, Any]: ...

    async def export(
        self,
        client_id: str,
        *,
        after: datetime | None = None,
        before: datetime | None = None,
        cursor: str | None = None,
        limit: int = ...,
    ) -> dict[str, Any]: ...


class App(Protocol):
    """The daemon as the api sees it: its runtime, and its status report."""

    @property
    def runtime(self) -> Services: ...

    def status(self) -> dict[str, Any]: ...


# A JSON-RPC handler as the api writes it: a module-level function of the app and the
# call's params, bound to the daemon's app by `memd.api.methods.build_registry`.
ApiHandler = Callable[[App, JsonParams], Awaitable[dict[str, Any]]]
