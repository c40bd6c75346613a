"""The JSON-RPC method table: validates params and hands each call to a service.

Handlers are thin on purpose: they name the params (so every bad input gets a -32602
that says which param is wrong) and call one service method. Methods that are not
built are simply not registered, so callers get -32601 instead of a fake answer.

Every handler is a module-level `async def handler(app, params)`, so it can be found,
read and tested by name; each api module lists its own in a `METHODS` table and
`build_registry` binds them all to one app.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from memd.access import client_rows
from memd.api import browse as api_browse
from memd.api import imports as api_imports
from memd.api import privacy as api_privacy
from memd.api import recall as api_recall
from memd.api.app import ApiHandler, App
from memd.rpc import JsonParams, Params, Registry


def build_registry(app: App) -> Registry:
    """Every api module's `METHODS`, each handler bound to `app`."""
    registry = Registry()
    tables: tuple[Mapping[str, ApiHandler], ...] = (
        METHODS,
        api_recall.METHODS,
        api_privacy.METHODS,
        api_imports.METHODS,
        api_browse.METHODS,
    )
    for table in tables:
        for name, handler in table.items():
            registry.add(name, functools.partial(handler, app))
    return registry


async def daemon_status(app: App, params: JsonParams) -> dict[str, Any]:
    Params(params).done()
    return app.status()


async def clients_list(app: App, params: JsonParams) -> dict[str, Any]:
    Params(params).done()
    return {"clients": client_rows(app.runtime.config)}


async def clients_reset(app: App, params: JsonParams) -> dict[str, Any]:
    with Params(params) as p:
        client_id = p.require("client_id", str)
    await app.runtime.client(client_id)
    return {"reset": app.runtime.reset(client_id)}


async def record_exchange(app: App, params: JsonParams) -> dict[str, Any]:
    with Params(params) as p:
        client_id = p.require("client_id", str)
        conversation_id = p.require("conversation_id", str)
        user = p.require("user", str)
        assistant = p.require("assistant", str)
        timestamp = p.optional("timestamp", str)
        exchange_id = p.optional("exchange_id", str)
    services = await app.runtime.client(client_id)
    result = await services.sessions.record_exchange(
        conversation_id, user, assistant, timestamp, exchange_id=exchange_id
    )
    services.wrote()
    return result


async def record_chat(app: App, params: JsonParams) -> dict[str, Any]:
    with Params(params) as p:
        client_id = p.require("client_id", str)
        messages = p.require("messages", list)
        response = p.require("response", dict)
        timestamp = p.optional("timestamp", str)
        after = p.optional("after", str)
    services = await app.runtime.client(client_id)
    result = await services.sessions.record_chat(messages, response, timestamp, after)
    services.wrote()
    return result


async def sessions_list(app: App, params: JsonParams) -> dict[str, Any]:
    with Params(params) as p:
        client_id = p.require("client_id", str)
    return {"sessions": await app.runtime.list_sessions(client_id)}


async def sessions_close(app: App, params: JsonParams) -> dict[str, Any]:
    with Params(params) as p:
        client_id = p.require("client_id", str)
    ended = await (await app.runtime.client(client_id)).sessions.close_active()
    return {"closed": bool(ended), "session": ended[0] if ended else None, "sessions": ended}


async def sessions_recompact(app: App, params: JsonParams) -> dict[str, Any]:
    with Params(params) as p:
        client_id = p.require("client_id", str)
        session_id = p.optional("session_id", str)
    return {"results": await app.runtime.recompact(client_id, session_id)}


METHODS: Mapping[str, ApiHandler] = {
    "daemon.status": daemon_status,
    "clients.list": clients_list,
    "clients.reset": clients_reset,
    "memory.record_exchange": record_exchange,
    "memory.record_chat": record_chat,
    "sessions.list": sessions_list,
    "sessions.close": sessions_close,
    "sessions.recompact": sessions_recompact,
}
