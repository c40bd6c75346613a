"""The JSON-RPC method table: validates params and hands each call to a service.

Handlers are thin on purpose: they name the params (so every bad input gets a -32602
that says which param is wrong) and call one service method. Methods that are not
built are simply not registered, so callers get -32601 instead of a fake answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memd.clients import client_rows
from memd.rpc import JsonParams, Params, Registry

if TYPE_CHECKING:
    from memd.daemon import Daemon


def build_registry(app: Daemon) -> Registry:
    registry = Registry()

    @registry.method("daemon.status")
    async def daemon_status(params: JsonParams) -> dict[str, Any]:
        Params(params).done()
        return app.status()

    @registry.method("clients.list")
    async def clients_list(params: JsonParams) -> dict[str, Any]:
        Params(params).done()
        return {"clients": client_rows(app.config)}

    return registry
