"""JSON-RPC methods for viewers of a client's memory (the memory browser, memd.ui):
`browse.conversations`, `browse.conversation` and `memory.forget_preview`.

They read the transcript files, like `memory.export`, and work for a client whose
memory is off (its files are still its own). The session states come from the live
client when memory runs for it; otherwise a transcript in archive/ is `compacted` and
any other is `ended`. `memory.forget_preview` takes exactly `memory.forget`'s selectors
and changes nothing; its query selector runs the same recall `memory.forget` runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from memd.access import check_client_id
from memd.api.app import ApiHandler, App, ClientServices
from memd.api.selectors import SelectorParams, time_param
from memd.errors import IndexUnavailable, InvalidParams, MemdError, UnknownClient
from memd.indexing import IndexUnavailableError
from memd.layout import ClientLayout
from memd.privacy import (
    list_conversations,
    preview,
    query_gate,
    read_conversation,
)
from memd.recall import recall
from memd.rpc import JsonParams, Params

MAX_EXCHANGES = 500  # exchanges of one page
MAX_TEXT = 1024 * 1024  # characters of one message's window


async def browse_conversations(app: App, params: JsonParams) -> dict[str, Any]:
    """Sessions newest first, each with its conversations (title, time span, size)."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        after = p.optional("after", str)
        before = p.optional("before", str)
    now = _now()
    after_t, before_t = time_param(after, "after", now), time_param(before, "before", now)
    layout = _layout(app, client_id)
    live = await _live(app, client_id)
    conv_ids, states = await _known(app, client_id, live)
    sessions = await asyncio.to_thread(
        list_conversations, layout, conv_ids, states, after_t, before_t
    )
    return {"client_id": client_id, "sessions": sessions}


async def browse_conversation(app: App, params: JsonParams) -> dict[str, Any]:
    """One conversation's exchanges, a page at a time, each text cut to a window."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        session_id = p.require("session_id", str)
        number = p.require("conversation", int)
        offset = p.optional("offset", int, 0)
        limit = p.optional("limit", int, 50)
        around = p.optional("around", int)
        text_offset = p.optional("text_offset", int, 0)
        text_limit = p.optional("text_limit", int, 20_000)
    _bounded("offset", offset, 0, 10**9)
    _bounded("limit", limit, 1, MAX_EXCHANGES)
    _bounded("text_offset", text_offset, 0, 10**12)
    _bounded("text_limit", text_limit, 1, MAX_TEXT)
    layout = _layout(app, client_id)
    live = await _live(app, client_id)
    conv_ids, states = await _known(app, client_id, live)
    return await asyncio.to_thread(
        read_conversation,
        layout,
        conv_ids,
        states,
        session_id,
        number,
        offset=offset,
        limit=limit,
        around=around,
        text_offset=text_offset,
        text_limit=text_limit,
    )


async def forget_preview(app: App, params: JsonParams) -> dict[str, Any]:
    """What `memory.forget` with the same params would remove now; nothing changes."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        given = SelectorParams.take(p, exchanges=False)
    selector = given.selector(_now())
    layout = _layout(app, client_id)
    live = await _live(app, client_id)
    external = {}
    if live is not None:
        external = {cid: key for key, cid in live.sessions.conversation_ids().items()}
    hits: list[tuple[str, str, int | None]] = []
    if given.query is not None:
        hits = await _hits(app, live, given.query)
    return await asyncio.to_thread(preview, layout, selector, external, hits)


async def _hits(
    app: App, live: ClientServices | None, query: str
) -> list[tuple[str, str, int | None]]:
    """The (source, heading, conversation) of each hit `memory.forget` would take for a
    query: recall's results under forget's gate (memd.privacy.query_gate), as
    memd.daemon.privacy searches."""
    if live is None:
        raise IndexUnavailable(
            "forgetting by query needs the client's index: enable memory for it, "
            "or forget by session or time"
        )
    layout = live.layout
    try:
        out = await recall(
            live.searcher,
            query,
            app.runtime.config.search_top_k,
            None,
            None,
            layout,
            settings=query_gate(app.runtime.config.recall),
            lane=live.recall_lane,
        )
    except IndexUnavailableError:
        raise IndexUnavailable(
            "the memory index is starting or restarting; retry shortly",
            data={"client_id": layout.client_id},
        ) from None
    return [
        (str(layout.root / r["source"]), r["heading"], r["conversation"]) for r in out["results"]
    ]


METHODS: Mapping[str, ApiHandler] = {
    "browse.conversations": browse_conversations,
    "browse.conversation": browse_conversation,
    "memory.forget_preview": forget_preview,
}


def _now() -> datetime:
    return datetime.now(UTC)


def _bounded(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidParams(f"{name} must be between {low} and {high}", data={"param": name})


def _layout(app: App, client_id: str) -> ClientLayout:
    """The client's folder; an id that is neither configured nor on disk is unknown."""
    check_client_id(client_id)
    config = app.runtime.config
    layout = ClientLayout(config.memory_dir, client_id)
    if client_id not in config.clients and not layout.root.is_dir():
        raise UnknownClient(
            f"unknown client {client_id!r}: no config and no memory folder",
            data={"client_id": client_id},
        )
    return layout


async def _live(app: App, client_id: str) -> ClientServices | None:
    """The client's running services, or None while memory is off for it."""
    client = app.runtime.config.clients.get(client_id)
    if client is None or not client.memory_on:
        return None
    try:
        return await app.runtime.client(client_id)
    except MemdError:
        return None


async def _known(
    app: App, client_id: str, live: ClientServices | None
) -> tuple[dict[tuple[str, int], str], dict[str, str]]:
    """MCP conversation ids and session states, from the live client (else none)."""
    if live is None:
        return {}, {}
    rows = await app.runtime.list_sessions(client_id)
    return live.sessions.conversation_ids(), {r["session_id"]: r["state"] for r in rows}
