"""Recall inside the Responses API loop: memd's tool offered as a function tool.

The rules of the chat loop (memd/proxy/loop.py): the tool is added to `tools` and its
instructions after the app's `instructions`; a response whose output calls the memory
tool is answered by `memory.call_tool`, and asked again with the round's output (less
the app's function calls: the model decides anew) and a `function_call_output` per
memory call appended to `input`, at most `max_tool_rounds` times, the last with
`tool_choice: "none"`. The app's own `previous_response_id` and `store` stay as sent,
so each round works whether the upstream keeps responses or not. Only the final answer
reaches the app; its id is the last round's, which is what a later
`previous_response_id` must name.

Streaming keeps time to first token: the first round's `response.created` and
`response.in_progress` go out at once, message and reasoning items as they come in every
round, renumbered (`output_index`, `sequence_number`) so the app sees one response. The
memory tool's items are never sent (its name is in `response.output_item.added`); the
app's function calls are held to the round's end. The closing `response.completed`
carries the last round's response with the output the app was sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from memd.proxy import upstream as up
from memd.proxy.apis import named_event
from memd.proxy.rounds import RecallTool, Reply, RoundLoop
from memd.proxy.stream import EventSplitter, StreamError, parse_chunk

FINAL = ("response.completed", "response.incomplete")


class ResponsesTool(RecallTool):
    """The recall tool as `memory.tools` serves it, as a Responses function tool."""

    @staticmethod
    def shape(tool: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "function",
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("inputSchema") or {"type": "object"},
            "strict": False,  # the API's default is strict, which memd's schema is not
        }


def refusal_reason(body: dict[str, Any], tool: ResponsesTool) -> str | None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "`tools` is not a list"
    if body.get("background"):
        return "the request runs in the background"
    for entry in tools or ():
        if isinstance(entry, dict) and entry.get("name") == tool.name:
            return f"the app has a tool of its own named {tool.name}"
    return None


def inject(body: dict[str, Any], tool: ResponsesTool) -> dict[str, Any]:
    out = dict(body)
    out["tools"] = [*(body.get("tools") or []), tool.definition]
    given, extra = body.get("instructions"), tool.instructions
    if extra:
        out["instructions"] = f"{given}\n\n{extra}" if isinstance(given, str) and given else extra
    return out


def is_call(item: Any, name: str | None = None) -> bool:
    ok = isinstance(item, dict) and item.get("type") == "function_call"
    return ok and (name is None or item.get("name") == name)


def failure_event(exc: BaseException) -> bytes:
    """The `error` event sent into a stream that broke off (the SDK raises it)."""
    error = up.failure_event(exc)["error"]
    return named_event({**error, "type": "error", "error": error})


def whole_response(raw: bytes) -> dict[str, Any] | None:
    """A finished response object from a body, or None."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("object") == "response":
        return data if data.get("status") in ("completed", "incomplete") else None
    return None


class ResponsesLoop(RoundLoop[ResponsesTool, "_Round"]):
    """One Responses request with the recall tool in the loop, streamed or not; the reply
    it records is the final response object."""

    sent: _Sent  # what the app has been sent, across rounds

    def _inject(self, body: dict[str, Any]) -> dict[str, Any]:
        return inject(body, self.tool)

    def _whole(self, raw: bytes) -> Reply | None:
        return whole_response(raw)

    def _calls_memory(self, reply: Reply) -> bool:
        return any(is_call(i, self.tool.name) for i in reply.get("output") or [])

    async def _answer(self, reply: Reply) -> None:
        await self._answers(reply.get("output") or [])

    async def _answers(self, output: list[Any]) -> None:
        """Append the round's output and the memory calls' results to the next input."""
        calls = [i for i in output if is_call(i, self.tool.name)]
        results = await asyncio.gather(
            *(self.call_memory(c["name"], c.get("arguments") or "") for c in calls)
        )
        given = self.upstream_body["input"]
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        kept = [i for i in output if not is_call(i) or is_call(i, self.tool.name)]
        answers = [
            {"type": "function_call_output", "call_id": c.get("call_id"), "output": text}
            for c, text in zip(calls, results, strict=True)
        ]
        self.upstream_body["input"] = [*items, *kept, *answers]

    def _last_round(self, reply: Reply, raw: bytes, headers: Any) -> tuple[web.Response, Reply]:
        """The response without its memory function calls."""
        output = reply.get("output") or []
        reply["output"] = [i for i in output if not is_call(i, self.tool.name)]
        body = json.dumps(reply, ensure_ascii=False).encode()
        return web.Response(status=200, body=body, headers=headers), reply

    def _stream_round(self, out: web.StreamResponse, first: bool) -> _Round:
        if first:
            self.sent = _Sent()
        return _Round(out, self.sent, self.tool.name, first=first)

    def _round_calls_memory(self, state: _Round) -> bool:
        return bool(state.memory)

    async def _answer_round(self, state: _Round) -> None:
        assert state.final is not None  # pump() returns only once it has the response
        await self._answers(state.final.get("output") or [])

    async def _close(self, state: _Round, memory: bool) -> Reply:
        assert state.final is not None
        await state.flush()
        # What the app was sent; a server that sends no output_item.done: the output.
        output = state.final.get("output") or []
        items = self.sent.items or [i for i in output if not is_call(i, self.tool.name)]
        self.reply = {**state.final, "output": list(items)}
        await state.close(self.reply)
        return self.reply

    def _failure_event(self, exc: BaseException) -> bytes:
        return failure_event(exc)

    def _failure_response(self, exc: BaseException) -> web.Response:
        return up.failure_response(exc, self.settings.read_timeout)


class _Sent:
    """What the app has been sent across rounds: the next numbers, the items so far."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.next_index = 0


class _Round:
    """One upstream stream inside the loop: forwards items now, holds function calls."""

    def __init__(self, out: web.StreamResponse, sent: _Sent, name: str, first: bool) -> None:
        self.out, self.sent, self.name, self.first = out, sent, name, first
        self.index: dict[int, int] = {}
        self.memory: set[int] = set()
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.final: dict[str, Any] | None = None
        self.final_type = "response.completed"

    async def pump(self, upstream: aiohttp.ClientResponse) -> None:
        splitter = EventSplitter()
        async for data in upstream.content.iter_any():
            for payload in splitter.feed(data):
                event = parse_chunk(payload)
                if event is not None and await self._route(event):
                    return
        raise StreamError("the upstream stream ended before the response was complete")

    async def _route(self, event: dict[str, Any]) -> bool:
        """Forward, hold or drop one event; True once the round's response is final."""
        kind = event.get("type")
        if kind in FINAL and isinstance(event.get("response"), dict):
            self.final, self.final_type = event["response"], str(kind)
            return True
        if kind in ("error", "response.failed"):
            raise StreamError(json.dumps(event)[:300])
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if self.first:
                await self._emit(event)
            return False
        if not isinstance(event.get("output_index"), int):
            await self._emit(event)
            return False
        index = event["output_index"]
        if kind == "response.output_item.added" and is_call(event.get("item"), self.name):
            self.memory.add(index)
        elif kind == "response.output_item.added" and is_call(event.get("item")):
            self.held[index] = []
        if index in self.memory:
            return False
        if index in self.held:
            self.held[index].append(event)
            return False
        if index not in self.index:
            self.index[index] = self.sent.next_index
            self.sent.next_index += 1
        await self._emit({**event, "output_index": self.index[index]})
        return False

    async def _emit(self, event: dict[str, Any]) -> None:
        if "sequence_number" in event:
            event = {**event, "sequence_number": self.sent.sequence}
            self.sent.sequence += 1
        if event.get("type") == "response.output_item.done":
            self.sent.items.append(event["item"])
        await self.out.write(named_event(event))

    async def flush(self) -> None:
        """The held app function calls, now that the round called no memory."""
        for events in self.held.values():
            app_index = self.sent.next_index
            self.sent.next_index += 1
            for event in events:
                await self._emit({**event, "output_index": app_index})

    async def close(self, final: dict[str, Any]) -> None:
        await self._emit({"type": self.final_type, "response": final, "sequence_number": 0})
        await self.out.write_eof()
