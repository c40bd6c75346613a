"""The tool-call rounds every recall loop drives: ask upstream, answer memory's calls, ask again.

The chat completions, Responses and Messages loops (`loop`, `responses_loop`,
`anthropic_loop`) differ in the shape of a reply, not in how the rounds go, so the rounds
are driven here once: at most `max_tool_rounds` answered rounds, the last sent with the
API's "no tool" choice so the model must answer. Not streamed, an answer that is not a
whole reply goes back to the app as it came. Streamed, the app's stream starts with the
first round the upstream streams; before that an upstream failure is answered as the
upstream gave it (or raised as `UpstreamFailed`), after it a failure is sent as an error
event and the connection is cut. A subclass says only what is API-specific: how the tool
is added, how a reply is read and answered, how one round streams and how the stream
closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

import aiohttp
from aiohttp import web

from memd.proxy import upstream as up
from memd.proxy.recorder import Stats
from memd.proxy.relay import Settings, UpstreamFailed, cut, send
from memd.proxy.stream import StreamError

CallMemory = Callable[[str, str], Awaitable[str]]  # (name, raw JSON arguments) -> result text
Reply = dict[str, Any]


@dataclass(frozen=True)
class RecallTool(ABC):
    """The recall tool as `memory.tools` serves it, in one API's shape (`definition`)."""

    name: str
    definition: dict[str, Any]
    instructions: str

    @classmethod
    def from_listing(cls, listing: dict[str, Any]) -> Self | None:
        """The tool of a `memory.tools` answer; None while memory is off for the client."""
        tools = listing.get("tools") or []
        if not listing.get("memory_on") or not tools:
            return None
        tool = tools[0]
        return cls(tool["name"], cls.shape(tool), listing.get("instructions") or "")

    @staticmethod
    @abstractmethod
    def shape(tool: dict[str, Any]) -> dict[str, Any]:
        """The API's tool definition, from MCP's (`name`, `description`, `inputSchema`)."""


class StreamRound(Protocol):
    """One upstream stream inside a loop: `pump` forwards what the app may see at once."""

    async def pump(self, upstream: aiohttp.ClientResponse) -> None: ...


ToolT = TypeVar("ToolT", bound=RecallTool)
RoundT = TypeVar("RoundT", bound=StreamRound)


class RoundLoop(ABC, Generic[ToolT, RoundT]):
    """One request with the recall tool in the loop, streamed or not."""

    NO_TOOL_CHOICE: ClassVar[Any] = "none"  # the last round's `tool_choice`

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: Settings,
        request: web.Request,
        body: dict[str, Any],
        tool: ToolT,
        call_memory: CallMemory,
    ) -> None:
        self.session, self.settings, self.request = session, settings, request
        self.tool, self.call_memory = tool, call_memory
        self.upstream_body = self._inject(body)
        # The reply to record once it is whole; the handler reads it if the app hangs up
        # while the last bytes go out (aiohttp then cancels the handler).
        self.reply: Reply | None = None

    # --- what each API says -----------------------------------------------------------

    @abstractmethod
    def _inject(self, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream request: the app's, plus the tool and its instructions."""

    @abstractmethod
    def _whole(self, raw: bytes) -> Reply | None:
        """The reply in a 200 body, or None when it is not one (sent back as it came)."""

    @abstractmethod
    def _calls_memory(self, reply: Reply) -> bool:
        """Whether a whole reply calls the memory tool."""

    @abstractmethod
    async def _answer(self, reply: Reply) -> None:
        """Run the reply's memory calls; append them and their results for the next round."""

    @abstractmethod
    def _last_round(self, reply: Reply, raw: bytes, headers: Any) -> tuple[web.Response, Reply]:
        """The last round still called memory: the answer without those calls (`raw` is
        its body, `reply` as `_whole` read it), and the reply to record."""

    @abstractmethod
    def _stream_round(self, out: web.StreamResponse, first: bool) -> RoundT:
        """A round streaming to `out` (`first`: the app has seen nothing of the reply yet)."""

    @abstractmethod
    def _round_calls_memory(self, state: RoundT) -> bool:
        """Whether a pumped round called the memory tool."""

    @abstractmethod
    async def _answer_round(self, state: RoundT) -> None:
        """`_answer` for a pumped round."""

    @abstractmethod
    async def _close(self, state: RoundT, memory: bool) -> Reply | None:
        """Send what the final round held back and end the stream; the reply to record,
        also set as `self.reply` once it is whole."""

    @abstractmethod
    def _failure_event(self, exc: BaseException) -> bytes:
        """The error event sent into a stream that broke off."""

    @abstractmethod
    def _failure_response(self, exc: BaseException) -> web.Response:
        """The 502/504 for an upstream that could not be reached before any byte."""

    # --- the rounds ---------------------------------------------------------------------

    async def run(self, stats: Stats, record: Callable[[Reply], None]) -> web.StreamResponse:
        """Answer the request and record the final reply, also when the app hangs up once
        that reply is whole."""
        stream = bool(self.upstream_body.get("stream"))
        try:
            response, reply = await (self.streamed() if stream else self.plain())
        except asyncio.CancelledError:
            if self.reply is not None:  # the app hung up after the answer was whole
                record(self.reply)
            raise
        except UpstreamFailed as exc:
            stats.upstream_errors += 1
            return self._failure_response(exc.cause)
        if response.status >= 400:
            stats.upstream_errors += 1
        if reply is not None:
            record(reply)
        return response

    def _round_body(self, round_no: int) -> bytes:
        if round_no == self.settings.max_tool_rounds:
            self.upstream_body["tool_choice"] = self.NO_TOOL_CHOICE
        return json.dumps(self.upstream_body, ensure_ascii=False).encode()

    async def plain(self) -> tuple[web.Response, Reply | None]:
        """The final answer as a response, and the reply to record (None: nothing)."""
        for round_no in range(self.settings.max_tool_rounds + 1):
            upstream = await send(
                self.session, self.settings, self.request, self._round_body(round_no)
            )
            try:
                raw = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamFailed(exc) from exc
            finally:
                upstream.release()
            headers = up.response_headers(upstream, keep_length=False)
            reply = self._whole(raw) if upstream.status == 200 else None
            if reply is None:
                return web.Response(status=upstream.status, body=raw, headers=headers), None
            if not self._calls_memory(reply):
                self.reply = reply
                return web.Response(status=200, body=raw, headers=headers), reply
            if round_no == self.settings.max_tool_rounds:
                response, self.reply = self._last_round(reply, raw, headers)
                return response, self.reply
            await self._answer(reply)
        raise AssertionError("unreachable")

    async def streamed(self) -> tuple[web.StreamResponse, Reply | None]:
        """Stream the final answer to the app: the response, and the reply to record."""
        out: web.StreamResponse | None = None
        for round_no in range(self.settings.max_tool_rounds + 1):
            try:
                upstream = await send(
                    self.session, self.settings, self.request, self._round_body(round_no)
                )
            except UpstreamFailed as exc:
                if out is None:
                    raise
                return await self._fail(out, exc.cause), None
            try:
                if upstream.status != 200 or not up.is_event_stream(upstream):
                    if out is None:
                        return await _buffered(upstream), None
                    failure = StreamError(f"the upstream answered {upstream.status}")
                    return await self._fail(out, failure), None
                if out is None:
                    out = web.StreamResponse(
                        status=200, headers=up.response_headers(upstream, keep_length=False)
                    )
                    await out.prepare(self.request)
                state = self._stream_round(out, first=round_no == 0)
                try:
                    await state.pump(upstream)
                except (aiohttp.ClientError, TimeoutError, StreamError) as exc:
                    return await self._fail(out, exc), None
            finally:
                upstream.release()
            memory = self._round_calls_memory(state)
            if memory and round_no < self.settings.max_tool_rounds:
                await self._answer_round(state)
                continue
            return out, await self._close(state, memory)
        raise AssertionError("unreachable")

    async def _fail(self, out: web.StreamResponse, exc: BaseException) -> web.StreamResponse:
        with contextlib.suppress(Exception):  # the app may be gone already
            await out.write(self._failure_event(exc))
        cut(self.request)
        return out


async def _buffered(upstream: aiohttp.ClientResponse) -> web.Response:
    """An upstream error answer as it came (status, headers, body; error bodies are small)."""
    try:
        raw = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamFailed(exc) from exc
    return web.Response(
        status=upstream.status, body=raw, headers=up.response_headers(upstream, keep_length=False)
    )
