"""JSON-RPC methods of privacy: `memory.forget` and `memory.export`.

`memory.forget` takes one selector (`exchanges` names exact keys, as a dry run listed
them) and `dry_run` (list what would go, change nothing); its result lists what it
removed (`forgotten`). Both work for a client whose memory is off (its files are still
its own); an unknown client id, a session or conversation that does not exist, or a
second selector are errors; a time range that matches nothing is an empty result, a
query that matches nothing relevant is refused (`not_found`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from memd.api.app import ApiHandler, App
from memd.api.selectors import SelectorParams, time_param
from memd.errors import InvalidParams
from memd.privacy import MAX_PAGE_SIZE, PAGE_SIZE
from memd.rpc import JsonParams, Params


async def memory_forget(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.forget`: one selector, or a dry run listing what it would remove."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        given = SelectorParams.take(p, exchanges=True)
        dry_run = p.optional("dry_run", bool, False)
    selector = given.selector(datetime.now(UTC))
    return await app.runtime.forget(client_id, selector, dry_run)


async def memory_redact(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.redact`: mask secrets in a client's files (or list them, on a dry run)."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        dry_run = p.optional("dry_run", bool, False)
        files = p.optional("files", list)
        rebuild = p.optional("rebuild", bool)
    if files is not None and not all(isinstance(f, str) for f in files):
        raise InvalidParams("files must be a list of file names", data={"param": "files"})
    return await app.runtime.redact(client_id, files, dry_run, rebuild)


async def memory_export(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.export`: a client's exchanges in a time range, a page at a time."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        after = p.optional("after", str)
        before = p.optional("before", str)
        cursor = p.optional("cursor", str)
        limit = p.optional("limit", int, PAGE_SIZE)
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidParams(f"limit must be between 1 and {MAX_PAGE_SIZE}", data={"param": "limit"})
    now = datetime.now(UTC)
    return await app.runtime.export(
        client_id,
        after=time_param(after, "after", now),
        before=time_param(before, "before", now),
        cursor=cursor,
        limit=limit,
    )


METHODS: Mapping[str, ApiHandler] = {
    "memory.forget": memory_forget,
    "memory.redact": memory_redact,
    "memory.export": memory_export,
}
