"""The Anthropic Messages API on the proxy: `POST /v1/messages` and its token counter.

Claude Code and every Anthropic SDK app reach it through `ANTHROPIC_BASE_URL`, with the
memd key as their API key (`x-api-key`, or `Authorization: Bearer`). A request takes
the same three paths as a chat completion (memd/proxy/server.py): memory off, forwarded
byte for byte and never recorded; memory on without recall, forwarded byte for byte and
recorded; memory on with recall, the tool loop of memd/proxy/anthropic_loop.py. The
upstream is `[proxy] anthropic_base_url` with `anthropic_api_key` (sent as `x-api-key`);
`anthropic-version` and `anthropic-beta` cross as the app sent them. Errors the proxy
makes itself are in Anthropic's shape, so the SDKs raise their usual exceptions.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from memd.proxy import anthropic_stream as ans
from memd.proxy import convert
from memd.proxy.anthropic_loop import AnthropicTool, MessagesLoop, refusal_reason
from memd.proxy.apis import BodyTee, EventTee, forward, key_problem
from memd.proxy.relay import Settings

if TYPE_CHECKING:
    from memd.proxy.server import ProxyApp

log = structlog.get_logger()


def register(router: web.UrlDispatcher, app: ProxyApp) -> None:
    route = MessagesRoute(app)
    router.add_post("/v1/messages", route.messages)
    router.add_post("/v1/messages/count_tokens", route.passthrough)


class MessagesRoute:
    def __init__(self, app: ProxyApp) -> None:
        self.app = app

    def settings(self) -> Settings:
        proxy = self.app.config().proxy
        return Settings(
            proxy.anthropic_base_url,
            proxy.anthropic_api_key,
            proxy.connect_timeout_seconds,
            proxy.read_timeout_seconds,
            proxy.max_tool_rounds,
            anthropic=True,
        )

    def _admit(self, request: web.Request) -> str | web.Response:
        """The client, or the answer to give: 401 for a bad key, 503 with no upstream."""
        client, problem = key_problem(self.app, request)
        if client is None:
            self.app.stats.unauthorized += 1
            response = ans.error_response(401, "authentication_error", problem or "")
            response.headers["WWW-Authenticate"] = 'Bearer realm="memd"'
            return response
        self.app.stats.requests += 1
        if not self.app.config().proxy.anthropic_base_url:
            return ans.error_response(
                503,
                "api_error",
                "the memd proxy has no Anthropic upstream: set anthropic_base_url "
                "(e.g. https://api.anthropic.com) in the [proxy] table of memd's config",
            )
        return client

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        client = self._admit(request)
        if isinstance(client, web.Response):
            return client
        return await self._forward(request, self.settings(), await request.read(), None, None)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        client = self._admit(request)
        if isinstance(client, web.Response):
            return client
        settings, raw = self.settings(), await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return ans.error_response(
                400,
                "invalid_request_error",
                "the body must be a JSON object with a `messages` list",
            )
        listing = await self.app.memory_tools(client)
        if listing is None or not listing.get("memory_on"):
            self.app.stats.forwarded_without_memory += 1
            return await self._forward(request, settings, raw, None, None)
        tool = AnthropicTool.from_listing(listing) if self.app.inject_recall(client) else None
        if tool is not None and (reason := refusal_reason(body, tool)) is not None:
            log.info("proxy.recall_not_added", client=client, reason=reason)
            tool = None
        if tool is None:
            return await self._forward(request, settings, raw, client, body)
        return await self._loop(request, settings, client, body, tool)

    async def _loop(
        self,
        request: web.Request,
        settings: Settings,
        client: str,
        body: dict[str, Any],
        tool: AnthropicTool,
    ) -> web.StreamResponse:
        loop = MessagesLoop(
            self.app.session,
            settings,
            request,
            body,
            tool,
            lambda name, args: self.app.call_memory(client, name, args),
        )
        return await loop.run(self.app.stats, lambda reply: self._record(client, body, reply))

    async def _forward(
        self,
        request: web.Request,
        settings: Settings,
        raw: bytes,
        client: str | None,
        body: dict[str, Any] | None,
    ) -> web.StreamResponse:
        tee: StreamTee | JsonTee | None = None
        if client is not None and body is not None:
            tee = StreamTee() if body.get("stream") else JsonTee()
        return await forward(
            self.app,
            request,
            settings,
            raw,
            tee,
            lambda reply: self._record(client or "", body or {}, reply),
            ans.failure_event,
            lambda exc: ans.failure_response(exc, settings.read_timeout),
        )

    def _record(self, client: str, body: dict[str, Any], reply: dict[str, Any]) -> None:
        """Record the turn in memd's one shape (memd/proxy/convert.py)."""
        messages = convert.anthropic_messages(body)
        if messages:
            self.app.recorder.submit(
                client, messages, convert.anthropic_reply(reply.get("content"))
            )


class StreamTee(EventTee):
    def __init__(self) -> None:
        self.assembler = ans.MessageAssembler()
        super().__init__(self.assembler.add)

    def reply(self) -> dict[str, Any] | None:
        return self.assembler.whole() if self.usable else None


class JsonTee(BodyTee):
    def reply(self) -> dict[str, Any] | None:
        message = self.parsed()
        if message is None or message.get("type") != "message":
            return None
        return message
