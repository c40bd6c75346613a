"""JSON-RPC method of imports: `memory.import_exchanges` (memd import).

A conversation's past exchanges, in order, written into their own sessions at their own
times (memd.sessions.importing); at most MAX_IMPORT a call, committed together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memd.api.app import ApiHandler, App
from memd.errors import InvalidParams
from memd.rpc import JsonParams, Params

MAX_IMPORT = 1000  # exchanges per call


async def import_exchanges(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.import_exchanges`: one conversation's past exchanges, committed together."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        conversation_id = p.require("conversation_id", str)
        exchanges = p.require("exchanges", list)
        session_id = p.optional("session_id", str)
        title = p.optional("title", str)
    if not 0 < len(exchanges) <= MAX_IMPORT:
        raise InvalidParams(
            f"exchanges must hold 1 to {MAX_IMPORT} exchanges", data={"param": "exchanges"}
        )
    services = await app.runtime.client(client_id)
    results = await services.sessions.import_exchanges(
        conversation_id, exchanges, session_id, title
    )
    services.wrote()
    return {"results": results}


METHODS: Mapping[str, ApiHandler] = {"memory.import_exchanges": import_exchanges}
