"""Recall inside the Messages API loop: memd's tool offered as a tool, answered here.

The same rules as the chat loop (memd/proxy/loop.py): the tool and its instructions are
added (instructions after the app's `system`, as a string or one more text block); a
reply that uses the memory tool is answered by `memory.call_tool` and asked again with
the tool_use and its tool_result (a reply's app tool_use blocks are dropped then: the
model decides anew), at most `max_tool_rounds` times, the last with `tool_choice` none.
Only the final answer reaches the app.

Streaming keeps time to first token: text and thinking blocks go out as they come, in
every round, renumbered so the app sees one message with consecutive block indexes. The
memory tool's blocks are never sent (its name is in `content_block_start`); the app's
tool_use blocks and the round's `message_delta` are held until the round ends.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import aiohttp
from aiohttp import web

from memd.proxy import anthropic_stream as ans
from memd.proxy.apis import named_event
from memd.proxy.rounds import RecallTool, Reply, RoundLoop
from memd.proxy.stream import EventSplitter, StreamError, parse_chunk


class AnthropicTool(RecallTool):
    """The recall tool as `memory.tools` serves it, in the Messages API's tool shape."""

    @staticmethod
    def shape(tool: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "input_schema": tool.get("inputSchema") or {"type": "object"},
        }


def refusal_reason(body: dict[str, Any], tool: AnthropicTool) -> str | None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "`tools` is not a list"
    for entry in tools or ():
        if isinstance(entry, dict) and entry.get("name") == tool.name:
            return f"the app has a tool of its own named {tool.name}"
    return None


def inject(body: dict[str, Any], tool: AnthropicTool) -> dict[str, Any]:
    out = dict(body)
    out["tools"] = [*(body.get("tools") or []), tool.definition]
    system, extra = body.get("system"), tool.instructions
    if extra and isinstance(system, list):
        out["system"] = [*system, {"type": "text", "text": extra}]
    elif extra and isinstance(system, str) and system:
        out["system"] = f"{system}\n\n{extra}"
    elif extra:
        out["system"] = extra
    return out


def is_call(block: Any, name: str | None = None) -> bool:
    ok = isinstance(block, dict) and block.get("type") == "tool_use"
    return ok and (name is None or block.get("name") == name)


class MessagesLoop(RoundLoop[AnthropicTool, "_Round"]):
    """One Messages request with the recall tool in the loop, streamed or not."""

    NO_TOOL_CHOICE: ClassVar[dict[str, str]] = {"type": "none"}  # only ever serialized
    sent: ans.MessageAssembler  # what the app has been sent, across rounds

    def _inject(self, body: dict[str, Any]) -> dict[str, Any]:
        return inject(body, self.tool)

    def _whole(self, raw: bytes) -> Reply | None:
        return _message(raw)

    def _calls_memory(self, reply: Reply) -> bool:
        return any(is_call(b, self.tool.name) for b in reply.get("content") or [])

    async def _answer(self, reply: Reply) -> None:
        await self._answers(reply.get("content") or [])

    async def _answers(self, content: list[dict[str, Any]]) -> None:
        """Append the memory calls and their results to the next upstream request."""
        calls = [b for b in content if is_call(b, self.tool.name)]
        results = await asyncio.gather(
            *(self.call_memory(c["name"], json.dumps(c.get("input") or {})) for c in calls)
        )
        kept = [b for b in content if not is_call(b) or is_call(b, self.tool.name)]
        answers = [
            {"type": "tool_result", "tool_use_id": c.get("id"), "content": text}
            for c, text in zip(calls, results, strict=True)
        ]
        self.upstream_body["messages"] = [
            *self.upstream_body["messages"],
            {"role": "assistant", "content": kept},
            {"role": "user", "content": answers},
        ]

    def _last_round(self, reply: Reply, raw: bytes, headers: Any) -> tuple[web.Response, Reply]:
        """The message without its memory tool_use blocks; `end_turn` when no app call is
        left."""
        content = reply.get("content") or []
        reply["content"] = [b for b in content if not is_call(b, self.tool.name)]
        if not any(is_call(b) for b in reply["content"]):
            reply["stop_reason"] = "end_turn"
        data = json.dumps(reply, ensure_ascii=False).encode()
        return web.Response(status=200, body=data, headers=headers), reply

    def _stream_round(self, out: web.StreamResponse, first: bool) -> _Round:
        if first:
            self.sent = ans.MessageAssembler()
        return _Round(out, self.sent, self.tool.name, first=first)

    def _round_calls_memory(self, state: _Round) -> bool:
        return any(is_call(b, self.tool.name) for b in state.reply.content())

    async def _answer_round(self, state: _Round) -> None:
        await self._answers(state.reply.content())

    async def _close(self, state: _Round, memory: bool) -> Reply | None:
        await state.finish(memory)
        self.reply = self.sent.whole()
        return self.reply

    def _failure_event(self, exc: BaseException) -> bytes:
        return ans.failure_event(exc)

    def _failure_response(self, exc: BaseException) -> web.Response:
        return ans.failure_response(exc, self.settings.read_timeout)


class _Round:
    """One upstream stream inside the loop: forwards text now, holds tool_use blocks."""

    def __init__(
        self, out: web.StreamResponse, sent: ans.MessageAssembler, name: str, first: bool
    ) -> None:
        self.out, self.sent, self.name, self.first = out, sent, name, first
        self.reply = ans.MessageAssembler()
        self.index: dict[int, int] = {}  # upstream block index -> the app's
        self.memory: set[int] = set()
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.delta: dict[str, Any] | None = None

    async def pump(self, upstream: aiohttp.ClientResponse) -> None:
        splitter = EventSplitter()
        async for data in upstream.content.iter_any():
            for payload in splitter.feed(data):
                event = parse_chunk(payload)
                if event is None:
                    continue
                self.reply.add(event)
                if self.reply.error is not None:
                    raise StreamError(json.dumps(self.reply.error)[:300])
                if self.reply.done:
                    return
                await self._route(event)
        raise StreamError("the upstream stream ended before the message was complete")

    async def _route(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            if self.first:
                await self._emit(event)
        elif kind == "message_delta":
            self.delta = event
        elif kind == "ping":
            await self.out.write(named_event(event))
        elif kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            index = int(event.get("index", 0))
            block = event.get("content_block")
            if kind == "content_block_start" and is_call(block, self.name):
                self.memory.add(index)
            elif kind == "content_block_start" and is_call(block):
                self.held[index] = []
            if index in self.memory:
                return
            if index in self.held:
                self.held[index].append(event)
                return
            if index not in self.index:
                self.index[index] = len(self.sent.blocks)
            await self._emit({**event, "index": self.index[index]})

    async def _emit(self, event: dict[str, Any]) -> None:
        self.sent.add(event)
        await self.out.write(named_event(event))

    async def finish(self, memory: bool) -> None:
        """The held app calls, the round's message_delta and message_stop."""
        for events in self.held.values():
            app_index = len(self.sent.blocks)
            for event in events:
                await self._emit({**event, "index": app_index})
        delta = self.delta or {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
        if memory and not self.held:
            delta = {**delta, "delta": {**delta.get("delta", {}), "stop_reason": "end_turn"}}
        await self._emit(delta)
        await self._emit({"type": "message_stop"})
        await self.out.write_eof()


def _message(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("type") == "message" else None
