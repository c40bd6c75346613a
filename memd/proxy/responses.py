"""The OpenAI Responses API on the proxy: `POST /v1/responses`.

Codex CLI, the OpenAI Agents SDK and any app on `client.responses` reach it with the
proxy as base URL and the memd key as API key. The three paths are those of a chat
completion (memd/proxy/server.py); the recall loop is memd/proxy/responses_loop.py.

Recording: a turn is the request's `input` (a string, or items: messages, function
calls and their outputs, content parts), after `instructions` as the system prompt, and
the response's output, all in memd's one shape (memd/proxy/convert.py). An app that
resends the whole input is matched by memd's prefix hashes like a chat app; an app that
sends `previous_response_id` and only the new items gets its history from the proxy's
durable map of response ids (memd/proxy/chain.py), so the turn lands in the same
conversation either way. The map is written before the app sees the response complete,
so its next turn always finds it. `store: false` asks the upstream to keep nothing; memd
still records (the client's memory settings govern that), but no map row is kept, since
such a response cannot be continued by id.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog
from aiohttp import web

from memd.proxy import convert
from memd.proxy import upstream as up
from memd.proxy.apis import EventTee, forward, named_event
from memd.proxy.chain import ResponseChain
from memd.proxy.relay import Settings, UpstreamFailed, send
from memd.proxy.responses_loop import ResponsesLoop, ResponsesTool, refusal_reason, whole_response

if TYPE_CHECKING:
    from memd.proxy.server import ProxyApp

log = structlog.get_logger()
FINAL = ("response.completed", "response.incomplete")


def register(router: web.UrlDispatcher, app: ProxyApp) -> None:
    router.add_post("/v1/responses", ResponsesRoute(app).responses)


def failure_event(exc: BaseException) -> bytes:
    """The `error` event sent into a stream that broke off (the SDK raises it)."""
    error = up.failure_event(exc)["error"]
    return named_event({"type": "error", **error, "error": error})


class ResponsesRoute:
    def __init__(self, app: ProxyApp) -> None:
        self.app = app
        self.chain = ResponseChain(app.keys.folder)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        client = self.app.authenticate(request)
        if isinstance(client, web.Response):
            return client
        self.app.stats.requests += 1
        settings, raw = self.app.settings(), await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        given = body.get("input") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(given, str | list):
            return up.error_response(
                400,
                "the body must be a JSON object with an `input` string or list",
                "invalid_request_error",
                "invalid_body",
            )
        listing = await self.app.memory_tools(client)
        if listing is None or not listing.get("memory_on"):
            self.app.stats.forwarded_without_memory += 1
            return await self._forward(request, settings, raw, None)
        turn = Turn(self, client, body)
        tool = ResponsesTool.from_listing(listing) if self.app.inject_recall(client) else None
        if tool is not None and (reason := refusal_reason(body, tool)) is not None:
            log.info("proxy.recall_not_added", client=client, reason=reason)
            tool = None
        if tool is None:
            return await self._forward(request, settings, raw, turn)
        return await self._loop(request, settings, turn, tool)

    async def _loop(
        self, request: web.Request, settings: Settings, turn: Turn, tool: ResponsesTool
    ) -> web.StreamResponse:
        loop = ResponsesLoop(
            self.app.session,
            settings,
            request,
            turn.body,
            tool,
            lambda name, args: self.app.call_memory(turn.client, name, args),
            turn.keep,
        )
        try:
            response, final = await (loop.streamed() if turn.body.get("stream") else loop.plain())
        except asyncio.CancelledError:
            if loop.final is not None:
                turn.record(loop.final)
            raise
        except UpstreamFailed as exc:
            self.app.stats.upstream_errors += 1
            return up.failure_response(exc.cause, settings.read_timeout)
        if response.status >= 400:
            self.app.stats.upstream_errors += 1
        if final is not None:
            turn.record(final)
        return response

    async def _forward(
        self, request: web.Request, settings: Settings, raw: bytes, turn: Turn | None
    ) -> web.StreamResponse:
        if turn is not None and not turn.body.get("stream"):
            return await self._forward_whole(request, settings, raw, turn)
        tee = StreamTee(turn.keep) if turn is not None else None
        return await forward(
            self.app,
            request,
            settings,
            raw,
            tee,
            lambda final: turn.record(final) if turn is not None else None,
            failure_event,
            lambda exc: up.failure_response(exc, settings.read_timeout),
        )

    async def _forward_whole(
        self, request: web.Request, settings: Settings, raw: bytes, turn: Turn
    ) -> web.StreamResponse:
        """A non-streamed answer, read whole so the map is written before it goes out."""
        try:
            upstream = await send(self.app.session, settings, request, raw)
            try:
                data = await upstream.read()
            finally:
                upstream.release()
        except (UpstreamFailed, aiohttp.ClientError, TimeoutError) as exc:
            self.app.stats.upstream_errors += 1
            cause = exc.cause if isinstance(exc, UpstreamFailed) else exc
            return up.failure_response(cause, settings.read_timeout)
        headers = up.response_headers(upstream, keep_length=True)
        final = whole_response(data) if upstream.status == 200 else None
        if upstream.status >= 400:
            self.app.stats.upstream_errors += 1
        if final is not None:
            turn.keep(final)
            turn.record(final)
        return web.Response(status=upstream.status, body=data, headers=headers)


class Turn:
    """One request's turn: its history, and how it is kept and recorded once answered."""

    def __init__(self, route: ResponsesRoute, client: str, body: dict[str, Any]) -> None:
        self.route, self.client, self.body = route, client, body
        previous = body.get("previous_response_id")
        self.previous = previous if isinstance(previous, str) else None
        self.history = route.chain.history(client, self.previous) if self.previous else None
        self.new = convert.responses_input(body, with_instructions=self.history is None)
        self._kept = False

    def keep(self, final: dict[str, Any]) -> None:
        """The map row for the response (once), unless the app asked for `store: false`."""
        rid = final.get("id")
        if self._kept or self.body.get("store") is False or not isinstance(rid, str):
            return
        self._kept = True
        reply = convert.responses_reply(final.get("output"))
        try:
            self.route.chain.add(self.client, rid, self.previous, [*self.new, reply])
        except Exception as exc:  # the map is a convenience; the chat must go on
            log.warning("proxy.response_map_failed", client=self.client, error=str(exc))

    def record(self, final: dict[str, Any]) -> None:
        self.keep(final)
        messages = [*(self.history or []), *self.new]
        if messages:
            reply = convert.responses_reply(final.get("output"))
            self.route.app.recorder.submit(self.client, messages, reply)


class StreamTee(EventTee):
    """Takes the final response from its `response.completed` event (and keeps it at once)."""

    def __init__(self, keep: Callable[[dict[str, Any]], None]) -> None:
        self.final: dict[str, Any] | None = None
        self.keep = keep
        super().__init__(self._event)

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("type") in FINAL and isinstance(event.get("response"), dict):
            self.final = event["response"]
            self.keep(self.final)

    def reply(self) -> dict[str, Any] | None:
        return self.final if self.usable else None
