"""The JSON-RPC method table: validates params and hands each call to a service.

Handlers are thin on purpose: they name the params (so every bad input gets a -32602
that says which param is wrong) and call one service method. Methods that are not
built are simply not registered, so callers get -32601 instead of a fake answer.
"""

from __future__ import annotations

from typing import Any

from memd.access import client_rows
from memd.api import browse as api_browse
from memd.api import imports as api_imports
from memd.api import privacy as api_privacy
from memd.api import recall as api_recall
from memd.api.app import App
from memd.rpc import JsonParams, Params, Registry


def build_registry(app: App) -> Registry:
    registry = Registry()

    @registry.method("daemon.status")
    async def daemon_status(params: JsonParams) -> dict[str, Any]:
        Params(params).done()
        return app.status()

    @registry.method("clients.list")
    async def clients_list(params: JsonParams) -> dict[str, Any]:
        Params(params).done()
        return {"clients": client_rows(app.runtime.config)}

    @registry.method("clients.reset")
    async def clients_reset(params: JsonParams) -> dict[str, Any]:
        with Params(params) as p:
            client_id = p.require("client_id", str)
        await app.runtime.client(client_id)
        return {"reset": app.runtime.reset(client_id)}

    @registry.method("memory.record_exchange")
    async def record_exchange(params: JsonParams) -> dict[str, Any]:
        with Params(params) as p:
            client_id = p.require("client_id", str)
            conversation_id = p.require("conversation_id", str)
            user = p.require("user", str)
            assistant = p.require("assistant", str)
            timestamp = p.optional("timestamp", str)
            exchange_id = p.optional("exchange_id", str)
        sessions = (await app.runtime.client(client_id)).sessions
        return await sessions.record_exchange(
            conversation_id, user, assistant, timestamp, exchange_id=exchange_id
        )

    @registry.method("memory.record_chat")
    async def record_chat(params: JsonParams) -> dict[str, Any]:
        with Params(params) as p:
            client_id = p.require("client_id", str)
            messages = p.require("messages", list)
            response = p.require("response", dict)
            timestamp = p.optional("timestamp", str)
            after = p.optional("after", str)
        sessions = (await app.runtime.client(client_id)).sessions
        return await sessions.record_chat(messages, response, timestamp, after)

    @registry.method("sessions.list")
    async def sessions_list(params: JsonParams) -> dict[str, Any]:
        with Params(params) as p:
            client_id = p.require("client_id", str)
        return {"sessions": await app.runtime.list_sessions(client_id)}

    @registry.method("sessions.close")
    async def sessions_close(params: JsonParams) -> dict[str, Any]:
        with Params(params) as p:
            client_id = p.require("client_id", str)
        ended = await (await app.runtime.client(client_id)).sessions.close_active()
        return {"closed": bool(ended), "session": ended[0] if ended else None, "sessions": ended}

    @registry.method("sessions.recompact")
    async def sessions_recompact(params: JsonParams) -> dict[str, Any]:
        with Params(params) as p:
            client_id = p.require("client_id", str)
            session_id = p.optional("session_id", str)
        return {"results": await app.runtime.recompact(client_id, session_id)}

    api_recall.register(registry, app)
    api_privacy.register(registry, app)
    api_imports.register(registry, app)
    api_browse.register(registry, app)
    return registry
