"""The OpenAI Responses API on the proxy: `POST /v1/responses`.

Codex CLI, the OpenAI Agents SDK and any app on `client.responses` reach it with the
proxy as base URL and the memd key as API key. The three paths are those of a chat
completion (memd/proxy/server.py); the recall loop is memd/proxy/responses_loop.py.

Recording: a turn is the request's `input` (a string, or items: messages, function
calls and their outputs, content parts), after `instructions` as the system prompt, and
the response's output, all in memd's one shape (memd/proxy/convert.py). An app that
resends the whole input is matched by memd's prefix hashes like a chat app. An app that
sends `previous_response_id` and only the new items is recorded with `after` = the head
memd returned for the response it names (kept in memd/proxy/chain.py), so the turn lands
in the same conversation either way. The head is looked up when the turn's record runs,
after the record of the turn before it (records of a client run in order), so a
continuation sent the moment the app got its answer still finds it. `store: false` asks
the upstream to keep nothing; memd still records (the client's memory settings govern
that), but no head is kept, since such a response cannot be continued by id.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from memd.proxy import convert
from memd.proxy import upstream as up
from memd.proxy.apis import BodyTee, EventTee, forward
from memd.proxy.chain import ResponseChain
from memd.proxy.relay import Settings
from memd.proxy.responses_loop import ResponsesLoop, ResponsesTool, failure_event, refusal_reason

if TYPE_CHECKING:
    from memd.proxy.server import ProxyApp

log = structlog.get_logger()
FINAL = ("response.completed", "response.incomplete")


def register(router: web.UrlDispatcher, app: ProxyApp) -> None:
    router.add_post("/v1/responses", ResponsesRoute(app).responses)


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
        )
        return await loop.run(self.app.stats, turn.record)

    async def _forward(
        self, request: web.Request, settings: Settings, raw: bytes, turn: Turn | None
    ) -> web.StreamResponse:
        tee: StreamTee | JsonTee | None = None
        if turn is not None:
            tee = StreamTee() if turn.body.get("stream") else JsonTee()
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


class Turn:
    """One request's turn: recorded once answered, after the turn it continues."""

    def __init__(self, route: ResponsesRoute, client: str, body: dict[str, Any]) -> None:
        self.route, self.client, self.body = route, client, body
        previous = body.get("previous_response_id")
        self.previous = previous if isinstance(previous, str) else None
        self.response_id: str | None = None

    def record(self, final: dict[str, Any]) -> None:
        rid = final.get("id")
        self.response_id = rid if isinstance(rid, str) else None
        reply = convert.responses_reply(final.get("output"))
        self.route.app.recorder.submit(self.client, [], reply, self)

    # --- memd.proxy.recorder.Continuation: run when the record before it is done ------

    def params(self, _messages: list[Any]) -> tuple[list[Any], str | None]:
        """The new items after the head of the turn named; unknown: all, as a new chat."""
        head = self.route.chain.head(self.client, self.previous) if self.previous else None
        return convert.responses_input(self.body, with_instructions=head is None), head

    def recorded(self, result: dict[str, Any]) -> None:
        """Keep the head under the response id, unless the app asked for `store: false`."""
        head = result.get("head")
        if self.response_id is None or self.body.get("store") is False:
            return
        if not isinstance(head, str):
            return
        try:
            self.route.chain.add(self.client, self.response_id, head)
        except Exception as exc:  # the map is a convenience; the chat is done already
            log.warning("proxy.response_map_failed", client=self.client, error=str(exc))


class StreamTee(EventTee):
    """Takes the final response from its `response.completed` event."""

    def __init__(self) -> None:
        self.final: dict[str, Any] | None = None
        super().__init__(self._event)

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("type") in FINAL and isinstance(event.get("response"), dict):
            self.final = event["response"]

    def reply(self) -> dict[str, Any] | None:
        return self.final if self.usable else None


class JsonTee(BodyTee):
    def reply(self) -> dict[str, Any] | None:
        body = self.parsed()
        if body is None or body.get("object") != "response":
            return None
        return body if body.get("status") in ("completed", "incomplete") else None
