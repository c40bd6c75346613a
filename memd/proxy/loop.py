"""Recall inside the loop: the `_memory` tool is added to the request and run by the proxy.

For a client with memory on (and `inject_recall`), the request goes upstream with memd's
recall tool added to `tools` and its instructions added to the system prompt. When the
model calls the tool, the proxy runs it (`memory.call_tool`), appends the call and its
result, and asks again, at most `max_tool_rounds` times; the last round is sent with
`tool_choice: "none"` so the model must answer. Only the final answer reaches the app.

The rule for one reply that calls both kinds of tool: the memory calls are answered
first. The proxy runs them and asks again with only those calls and their results in the
history; the app's calls of that reply are not returned, because the model, now knowing
what it recalled, decides anew. The first reply that calls no memory tool is returned as
it is, the app's tool calls in it included.

Streaming keeps time to first token: content deltas are forwarded the moment they come,
in every round (a model that says "let me check" before calling the tool has said it to
the app too: the recorded reply is exactly what the app was sent). Tool-call deltas and
the finishing chunk of a round are held until the round ends, since only then is it known
whether the round called memory; held app calls are then sent as one delta.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import aiohttp
from aiohttp import web

from memd.proxy import upstream as up
from memd.proxy.relay import first_message
from memd.proxy.rounds import RecallTool, Reply, RoundLoop
from memd.proxy.stream import (
    DONE,
    EventSplitter,
    ReplyAssembler,
    StreamError,
    encode_event,
    parse_chunk,
)


class MemoryTool(RecallTool):
    """The recall tool as `memory.tools` serves it, in the chat API's function shape."""

    @staticmethod
    def shape(tool: dict[str, Any]) -> dict[str, Any]:
        function = {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("inputSchema") or {"type": "object"},
        }
        return {"type": "function", "function": function}


def refusal_reason(body: dict[str, Any], tool: MemoryTool) -> str | None:
    """Why the tool cannot be added to this request, or None when it can."""
    if "functions" in body:
        return "the request uses legacy `functions`"
    if body.get("n") not in (None, 1):
        return "the request asks for several choices (n > 1)"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "`tools` is not a list"
    for entry in tools or ():
        if isinstance(entry, dict) and (entry.get("function") or {}).get("name") == tool.name:
            return f"the app has a tool of its own named {tool.name}"
    return None


def inject(body: dict[str, Any], tool: MemoryTool) -> dict[str, Any]:
    """The upstream request: the app's, plus the tool and its instructions."""
    out = dict(body)
    out["tools"] = [*(body.get("tools") or []), tool.definition]
    messages = list(body["messages"])
    first = messages[0] if messages else None
    if (
        isinstance(first, dict)
        and first.get("role") in ("system", "developer")
        and isinstance(first.get("content"), str)
    ):
        messages[0] = {**first, "content": f"{first['content']}\n\n{tool.instructions}"}
    elif tool.instructions:
        messages.insert(0, {"role": "system", "content": tool.instructions})
    out["messages"] = messages
    return out


def split_calls(calls: Any, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(memory calls, app calls) of a reply's tool_calls."""
    memory: list[dict[str, Any]] = []
    app: list[dict[str, Any]] = []
    for call in calls or ():
        fn = call.get("function") if isinstance(call, dict) else None
        (memory if isinstance(fn, dict) and fn.get("name") == name else app).append(call)
    return memory, app


class ToolLoop(RoundLoop[MemoryTool, "_Round"]):
    """One chat request with the recall tool in the loop, streamed or not."""

    sent: ReplyAssembler  # what the app has been sent, across rounds

    def _inject(self, body: dict[str, Any]) -> dict[str, Any]:
        return inject(body, self.tool)

    def _whole(self, raw: bytes) -> Reply | None:
        return first_message(raw)

    def _calls_memory(self, reply: Reply) -> bool:
        return bool(split_calls(reply.get("tool_calls"), self.tool.name)[0])

    async def _answer(self, reply: Reply) -> None:
        await self._answers(reply, split_calls(reply.get("tool_calls"), self.tool.name)[0])

    async def _answers(self, reply: dict[str, Any], calls: list[dict[str, Any]]) -> None:
        """Append the memory calls and their results to the next upstream request."""
        results = await asyncio.gather(
            *(
                self.call_memory(c["function"]["name"], c["function"].get("arguments") or "")
                for c in calls
            )
        )
        asked = {"role": "assistant", "content": reply.get("content"), "tool_calls": calls}
        self.upstream_body["messages"] = [
            *self.upstream_body["messages"],
            asked,
            *(
                {"role": "tool", "tool_call_id": c.get("id"), "content": text}
                for c, text in zip(calls, results, strict=True)
            ),
        ]

    def _last_round(self, reply: Reply, raw: bytes, headers: Any) -> tuple[web.Response, Reply]:
        """The first choice without its memory calls; `stop` when no app call is left."""
        app = split_calls(reply.get("tool_calls"), self.tool.name)[1]
        data = json.loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
        if app:
            message["tool_calls"] = app
        else:
            message.pop("tool_calls", None)
            choice["finish_reason"] = "stop"
        return web.Response(status=200, body=json.dumps(data).encode(), headers=headers), message

    # --- streamed -------------------------------------------------------------------

    def _stream_round(self, out: web.StreamResponse, first: bool) -> _Round:
        if first:
            self.sent = ReplyAssembler()
        return _Round(out, self.sent, self.tool.name)

    def _round_calls_memory(self, state: _Round) -> bool:
        return bool(state.memory)

    async def _answer_round(self, state: _Round) -> None:
        await self._answers(state.reply.message(), state.memory)

    async def _close(self, state: _Round, memory: bool) -> Reply:
        closing = state.closing()
        self.reply = self.sent.message()
        await state.finish(closing)
        return self.reply

    def _failure_event(self, exc: BaseException) -> bytes:
        return encode_event(up.failure_event(exc))

    def _failure_response(self, exc: BaseException) -> web.Response:
        return up.failure_response(exc, self.settings.read_timeout)


class _Round:
    """One upstream stream inside the loop: forwards content now, holds tool calls."""

    def __init__(self, out: web.StreamResponse, sent: ReplyAssembler, name: str) -> None:
        self.out = out
        self.sent = sent
        self.name = name
        self.reply = ReplyAssembler()
        self.finish_chunk: dict[str, Any] | None = None
        self.usage_chunk: dict[str, Any] | None = None
        self.template: dict[str, Any] = {}
        self.memory: list[dict[str, Any]] = []
        self.app: list[dict[str, Any]] = []

    async def pump(self, upstream: aiohttp.ClientResponse) -> None:
        splitter = EventSplitter()
        async for data in upstream.content.iter_any():
            for payload in splitter.feed(data):
                chunk = parse_chunk(payload)
                self.reply.add(chunk)
                if chunk is None:
                    self._settle()
                    return
                await self._forward(chunk)
        if self.reply.finish_reason is None:
            raise StreamError("the upstream stream ended before the answer was complete")
        self._settle()

    def _settle(self) -> None:
        if self.reply.error is not None:
            raise StreamError(str(self.reply.error))
        self.memory, self.app = split_calls(self.reply.tool_calls(), self.name)

    async def _forward(self, chunk: dict[str, Any]) -> None:
        choices = chunk.get("choices")
        if not choices:
            if "usage" in chunk:
                self.usage_chunk = chunk
            elif "error" not in chunk:
                await self._emit(chunk)
            return
        self.template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        choice = dict(choices[0])
        delta = {k: v for k, v in (choice.get("delta") or {}).items() if k != "tool_calls"}
        if choice.get("finish_reason") is not None:
            self.finish_chunk = copy.deepcopy({**chunk, "choices": [{**choice, "delta": {}}]})
            choice["finish_reason"] = None
        if "role" in delta and self.sent.content_started:
            del delta["role"]
        if any(v not in (None, "") for v in delta.values()) or (
            "role" in delta and not self.sent.content_started
        ):
            await self._emit({**chunk, "choices": [{**choice, "delta": delta}]})

    async def _emit(self, chunk: dict[str, Any]) -> None:
        self.sent.content_started = True
        self.sent.add(chunk)
        await self.out.write(encode_event(chunk))

    def closing(self) -> list[dict[str, Any]]:
        """The chunks that end the app's stream (held app calls, finish, usage), counted as
        sent already: the reply is whole from here on, even if the app hangs up now."""
        chunks = []
        if self.app:
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(self.app)]}
            chunks.append(
                {**self.template, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            )
        finish = self.finish_chunk or {
            **self.template,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        if self.memory and not self.app:
            finish["choices"][0]["finish_reason"] = "stop"
        chunks.append(finish)
        if self.usage_chunk is not None:
            chunks.append(self.usage_chunk)
        for chunk in chunks:
            self.sent.add(chunk)
        return chunks

    async def finish(self, chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            await self.out.write(encode_event(chunk))
        await self.out.write(encode_event(DONE))
        await self.out.write_eof()
