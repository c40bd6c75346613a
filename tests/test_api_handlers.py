"""The JSON-RPC handlers by name: each is a module-level function listed in its module's
`METHODS` table, so it can be found, read and called directly, without a socket.

The app handed in is any object of `memd.api.app.App`'s shape (that protocol exists for
this): a real parsed config, and a runtime that fails the test if a handler reaches it
when the call should have been refused at its params.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from memd import recall as rc
from memd.api import browse, imports, methods, privacy
from memd.api import recall as api_recall
from memd.api.methods import build_registry
from memd.config import Config, parse_config
from memd.errors import (
    Busy,
    ClientDisabled,
    IndexUnavailable,
    InvalidParams,
    Timeout,
    UnknownClient,
)
from memd.indexing import IndexUnavailableError

MODULES = (methods, api_recall, privacy, imports, browse)


@dataclass
class Runtime:
    """The config in force; any service call is a test failure (params come first)."""

    config: Config
    calls: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the handler reached the runtime's {name} for a refused call")


@dataclass
class FakeApp:
    runtime: Runtime

    def status(self) -> dict[str, Any]:
        return {"ok": True}


@pytest.fixture
def app(tmp_path: Path) -> FakeApp:
    config = parse_config(
        {
            "memory_dir": str(tmp_path / "memory"),
            "socket": str(tmp_path / "memd.sock"),
            "clients": {
                "on": {"memory_enabled": True, "mode": "both"},
                "off": {"memory_enabled": False, "mode": "both"},
            },
        }
    )
    return FakeApp(Runtime(config))


def test_every_registered_method_is_a_named_module_function() -> None:
    registry = build_registry(None)
    tables: dict[str, Any] = {}
    for module in MODULES:
        assert not set(tables) & set(module.METHODS), "a method is in two tables"
        tables.update(module.METHODS)
    assert registry.names() == sorted(tables)
    for name, handler in tables.items():
        module = importlib.import_module(handler.__module__)
        assert "<locals>" not in handler.__qualname__, name
        assert getattr(module, handler.__name__) is handler, name
        assert registry.get(name).func is handler, name


def test_daemon_status_answers_the_apps_status_and_rejects_params(app: FakeApp) -> None:
    assert asyncio.run(methods.daemon_status(app, {})) == {"ok": True}
    with pytest.raises(InvalidParams) as err:
        asyncio.run(methods.daemon_status(app, {"verbose": True}))
    assert err.value.data == {"param": "verbose"}


def test_clients_list_reads_the_config(app: FakeApp) -> None:
    rows = asyncio.run(methods.clients_list(app, None))["clients"]
    assert {r["client_id"]: r["memory_on"] for r in rows} == {"on": True, "off": False}


@pytest.mark.parametrize("limit", [0, -1, 10**9])
def test_export_refuses_a_limit_out_of_range_before_any_service(app: FakeApp, limit: int) -> None:
    with pytest.raises(InvalidParams) as err:
        asyncio.run(privacy.memory_export(app, {"client_id": "on", "limit": limit}))
    assert err.value.data == {"param": "limit"}


def test_redact_refuses_files_that_are_not_names(app: FakeApp) -> None:
    with pytest.raises(InvalidParams) as err:
        asyncio.run(privacy.memory_redact(app, {"client_id": "on", "files": [1]}))
    assert err.value.data == {"param": "files"}


def test_import_refuses_an_empty_batch(app: FakeApp) -> None:
    params = {"client_id": "on", "conversation_id": "c", "exchanges": []}
    with pytest.raises(InvalidParams) as err:
        asyncio.run(imports.import_exchanges(app, params))
    assert err.value.data == {"param": "exchanges"}


def test_memory_tools_by_client(app: FakeApp) -> None:
    on = asyncio.run(api_recall.memory_tools(app, {"client_id": "on"}))
    assert on["memory_on"] is True
    assert [t["name"] for t in on["tools"]] == [app.runtime.config.recall_tool_name]
    off = asyncio.run(api_recall.memory_tools(app, {"client_id": "off"}))
    assert (off["memory_on"], off["tools"]) == (False, [])
    assert off["reason"]["kind"] == ClientDisabled("").kind
    unknown = asyncio.run(api_recall.memory_tools(app, {"client_id": "nobody"}))
    assert unknown["reason"]["kind"] == UnknownClient("").kind


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (rc.RecallBusyError("lane full"), Busy),
        (IndexUnavailableError("no socket"), IndexUnavailable),
        (rc.RecallTimeoutError("deadline"), Timeout),
    ],
)
def test_a_recall_that_cannot_run_is_its_domain_error(failure: Exception, kind: type) -> None:
    error = api_recall._recall_error("on", failure)
    assert type(error) is kind
    assert error.data == {"client_id": "on"}
    assert "'on'" in error.message
