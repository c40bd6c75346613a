"""The proxy's HTTP side: routes, bearer-key checks, and which path a request takes.

A chat request of a client takes one of three paths, decided per request from
`memory.tools` (memd's own view, so a config reload applies at once):

- memory off (or memd unreachable): forwarded byte for byte, never recorded;
- memory on, no recall tool (`inject_recall = false`, or a request the tool cannot be
  added to): forwarded byte for byte, the reply rebuilt beside the stream and recorded;
- memory on with recall: the tool loop (memd/proxy/loop.py), then recorded.

Every other `/v1/...` request (`GET /v1/models` first of all) is forwarded as it is, key
checked. A missing, malformed or wrong key is a 401 before anything is read or sent on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from memd.config import Config
from memd.errors import RpcError
from memd.proxy import anthropic, responses
from memd.proxy import upstream as up
from memd.proxy.keys import KeyStore
from memd.proxy.loop import MemoryTool, ToolLoop, refusal_reason
from memd.proxy.recorder import Recorder, Stats
from memd.proxy.relay import Settings, Tee, UpstreamFailed, relay, send
from memd.proxy.rpc import AsyncMemdClient, MemdUnavailable

log = structlog.get_logger()

MAX_REQUEST = 64 * 1024 * 1024  # long histories with images; memd records up to 8 MiB
# `memory.tools` depends on memd's config only; a listing is reused while the proxy's
# config is the same object (a reload replaces it) and for at most this long, which
# bounds staleness for a standalone proxy whose memd reads another file. Measured under
# load (2 cores, load 9): one call costs ~3.5 ms, the whole budget of the proxy's hop.
TOOLS_TTL = 5.0
UNAVAILABLE_TEXT = "Memory is not available right now ({error}); answer without it."


class ProxyApp:
    """The request handlers; `config` is called per request for the settings in force."""

    def __init__(
        self,
        config: Callable[[], Config],
        rpc: AsyncMemdClient,
        keys: KeyStore,
        stats: Stats,
        recorder: Recorder,
        session: aiohttp.ClientSession,
    ) -> None:
        self.config = config
        self.rpc = rpc
        self.keys = keys
        self.stats = stats
        self.recorder = recorder
        self.session = session
        self._tools: dict[str, tuple[Config, float, dict[str, Any]]] = {}

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST)
        app.router.add_post("/v1/chat/completions", self.chat)
        anthropic.register(app.router, self)
        responses.register(app.router, self)
        app.router.add_route("*", "/v1/{tail:.*}", self.passthrough)
        return app

    def settings(self) -> Settings:
        proxy = self.config().proxy
        return Settings(
            proxy.upstream_base_url,
            proxy.upstream_api_key,
            proxy.connect_timeout_seconds,
            proxy.read_timeout_seconds,
            proxy.max_tool_rounds,
        )

    # --- identity ---------------------------------------------------------------------

    def authenticate(self, request: web.Request) -> str | web.Response:
        """The client the bearer key names, or the 401 to answer."""
        header = request.headers.get("Authorization")
        if not header:
            return self._unauthorized(
                "missing API key: send your memd proxy key as "
                "`Authorization: Bearer <key>` (`memd proxy key CLIENT`)"
            )
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            return self._unauthorized("malformed Authorization header: expected `Bearer <key>`")
        client_id = self.keys.client_for(token)
        if client_id is None:
            return self._unauthorized(
                "invalid API key: not a current memd proxy key "
                "(`memd proxy key CLIENT` shows the right one)"
            )
        return client_id

    def _unauthorized(self, message: str) -> web.Response:
        self.stats.unauthorized += 1
        response = up.error_response(401, message, "invalid_request_error", "invalid_api_key")
        response.headers["WWW-Authenticate"] = 'Bearer realm="memd"'
        return response

    # --- routes -----------------------------------------------------------------------

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        client = self.authenticate(request)
        if isinstance(client, web.Response):
            return client
        self.stats.requests += 1
        return await self.forward(request, self.settings(), await request.read())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        client = self.authenticate(request)
        if isinstance(client, web.Response):
            return client
        self.stats.requests += 1
        settings = self.settings()
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return up.error_response(
                400,
                "the body must be a JSON object with a `messages` list",
                "invalid_request_error",
                "invalid_body",
            )
        listing = await self.memory_tools(client)
        if listing is None or not listing.get("memory_on"):
            self.stats.forwarded_without_memory += 1
            return await self.forward(request, settings, raw)
        tool = MemoryTool.from_listing(listing) if self.inject_recall(client) else None
        if tool is not None and (reason := refusal_reason(body, tool)) is not None:
            log.info("proxy.recall_not_added", client=client, reason=reason)
            tool = None
        if tool is None:
            return await self.forward(request, settings, raw, client, body["messages"])
        loop = ToolLoop(
            self.session,
            settings,
            request,
            body,
            tool,
            lambda name, args: self.call_memory(client, name, args),
        )
        return await loop.run(
            self.stats, lambda reply: self.recorder.submit(client, body["messages"], reply)
        )

    async def forward(
        self,
        request: web.Request,
        settings: Settings,
        raw: bytes,
        client: str | None = None,
        messages: list[Any] | None = None,
    ) -> web.StreamResponse:
        """Relay as is; with a client, record the reply the relayed answer carried."""
        try:
            upstream = await send(self.session, settings, request, raw)
        except UpstreamFailed as exc:
            self.stats.upstream_errors += 1
            return up.failure_response(exc.cause, settings.read_timeout)
        try:
            record = client is not None and upstream.status == 200
            tee = Tee(up.is_event_stream(upstream)) if record else None
            response, complete = await relay(request, upstream, tee)
        except asyncio.CancelledError:
            self._record(client, messages, tee)  # only an answer the tee saw whole
            raise
        finally:
            upstream.release()
        if upstream.status >= 400 or not complete:
            self.stats.upstream_errors += 1
        if complete:
            self._record(client, messages, tee)
        return response

    def _record(self, client: str | None, messages: list[Any] | None, tee: Tee | None) -> None:
        reply = tee.reply() if tee is not None else None
        if client is not None and messages is not None and reply is not None:
            self.recorder.submit(client, messages, reply)

    # --- memd, through its socket API ----------------------------------------------------

    def inject_recall(self, client_id: str) -> bool:
        client = self.config().clients.get(client_id)
        return client.inject_recall if client is not None else True

    async def memory_tools(self, client_id: str) -> dict[str, Any] | None:
        """`memory.tools` for the client; None when memd cannot say (then: no memory)."""
        config, now = self.config(), time.monotonic()
        cached = self._tools.get(client_id)
        if cached is not None and cached[0] is config and cached[1] > now:
            return cached[2]
        try:
            listing = await self.rpc.call("memory.tools", {"client_id": client_id})
            self._tools[client_id] = (config, now + TOOLS_TTL, listing)
            return listing
        except (MemdUnavailable, RpcError) as exc:
            self.stats.memd_unavailable += 1
            log.warning("proxy.memd_unavailable", client=client_id, error=str(exc))
            return None

    async def call_memory(self, client_id: str, name: str, arguments: str) -> str:
        """Run one recall call for the model; every failure is text the model can read."""
        self.stats.recall_calls += 1
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return f'Invalid arguments for {name}: give a JSON object such as {{"query": ...}}.'
        try:
            result = await self.rpc.call(
                "memory.call_tool", {"client_id": client_id, "name": name, "arguments": args}
            )
        except (MemdUnavailable, RpcError) as exc:
            log.warning("proxy.recall_failed", client=client_id, error=str(exc))
            return UNAVAILABLE_TEXT.format(error=exc)
        return "\n".join(
            part.get("text", "")
            for part in result.get("content") or ()
            if isinstance(part, dict) and part.get("type") == "text"
        )
