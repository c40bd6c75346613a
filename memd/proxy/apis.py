"""What the Messages and Responses routes share: keys, named events, the recorded relay.

Both APIs stream server-sent events with an `event:` line naming each one (the SDKs
dispatch on it), both are relayed byte for byte when no tool is added, and both record
through a `tee` that rebuilds the reply beside the stream. The key check accepts the
memd key in `x-api-key` (what Anthropic SDKs and Claude Code send) or in
`Authorization: Bearer` (what OpenAI SDKs send); a missing, malformed or unknown key is
a 401 before the body is read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from memd.proxy.relay import Settings, UpstreamFailed, relay, send
from memd.proxy.stream import EventSplitter, StreamError, parse_chunk

if TYPE_CHECKING:
    from memd.proxy.server import ProxyApp

MISSING = "missing API key: send your memd proxy key (`memd proxy key CLIENT`)"
MALFORMED = "malformed Authorization header: expected `Bearer <key>`"
INVALID = "invalid API key: not a current memd proxy key (`memd proxy key CLIENT`)"


def named_event(data: dict[str, Any]) -> bytes:
    """One SSE event whose name is its `type` (how both APIs stream)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data.get('type', 'message')}\ndata: {text}\n\n".encode()


def key_problem(app: ProxyApp, request: web.Request) -> tuple[str | None, str | None]:
    """(client, None) for a good key, (None, why not) otherwise."""
    token = request.headers.get("x-api-key")
    if token is None:
        header = request.headers.get("Authorization")
        if not header:
            return None, MISSING
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None, MALFORMED
    token = token.strip()
    if not token or " " in token:
        return None, MALFORMED
    client = app.keys.client_for(token)
    return (client, None) if client is not None else (None, INVALID)


class Tee(Protocol):
    """Sees the relayed bytes; `reply()` is the whole answer to record, or None."""

    def __call__(self, data: bytes) -> None: ...

    def reply(self) -> Any: ...


class EventTee:
    """A tee over a stream of named JSON events: `on_event` gets each one parsed."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        self.on_event = on_event
        self.usable = True
        self._splitter = EventSplitter()

    def __call__(self, data: bytes) -> None:
        if not self.usable:
            return
        try:
            for payload in self._splitter.feed(data):
                event = parse_chunk(payload)
                if event is not None:
                    self.on_event(event)
        except StreamError:
            self.usable = False


class BodyTee:
    """A tee over a JSON body (bounded): the parsed object once it is whole."""

    LIMIT = 16 * 1024 * 1024

    def __init__(self) -> None:
        self._body = bytearray()

    def __call__(self, data: bytes) -> None:
        if len(self._body) <= self.LIMIT:
            self._body += data

    def parsed(self) -> dict[str, Any] | None:
        if len(self._body) > self.LIMIT:
            return None
        try:
            value = json.loads(bytes(self._body))
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


async def forward(
    app: ProxyApp,
    request: web.Request,
    settings: Settings,
    raw: bytes,
    tee: Tee | None,
    record: Callable[[Any], None],
    failure: Callable[[BaseException], bytes],
    failed: Callable[[BaseException], web.Response],
) -> web.StreamResponse:
    """Relay as is; with a tee, `record` gets the reply of a complete 200 answer."""
    try:
        upstream = await send(app.session, settings, request, raw)
    except UpstreamFailed as exc:
        app.stats.upstream_errors += 1
        return failed(exc.cause)
    tee = tee if upstream.status == 200 else None
    try:
        response, complete = await relay(request, upstream, tee, failure)
    except asyncio.CancelledError:
        if tee is not None and (reply := tee.reply()) is not None:
            record(reply)  # the answer was whole before the app hung up
        raise
    finally:
        upstream.release()
    if upstream.status >= 400 or not complete:
        app.stats.upstream_errors += 1
    if complete and tee is not None and (reply := tee.reply()) is not None:
        record(reply)
    return response
