"""Stand-ins for the Anthropic Messages API and the OpenAI Responses API on 127.0.0.1.

The same aiohttp server as tests/support/fake_openai.py (chat completions, `/v1/models`)
with two more routes, answering like the real APIs (shapes from the official SDKs'
types) and steered, as there, by what the user says last:

- `RECALL: <query>` with the memory tool offered: calls it; once its result came back
  in the history, answers `From memory: <result>`;
- `APPTOOL: <name>`: calls the app's tool `<name>`; after its result: `Tool said: ...`;
- `BOTH: <name>`: calls the memory tool and `<name>` in one reply, then (after the
  memory result) `<name>` alone;
- `THINK: <text>` (Messages): a thinking block, then `Echo: ...`;
- anything else: `Echo: <text>`.

Streams as the APIs do (named events). Modes as FakeUpstream: `error` (status, body in
the API's error shape), `hang`, `drop` (cut after the first text delta). Responses are
kept by id, so `previous_response_id` works as upstream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

from aiohttp import web

from tests.support.fake_openai import FakeUpstream

Item = dict[str, Any]


class FakeApis(FakeUpstream):
    """`with FakeApis() as fake:`; `fake.base_url` (OpenAI, .../v1), `fake.anthropic_url`."""

    def __init__(self, memory_tool: str = "MemoryRecall") -> None:
        super().__init__(memory_tool)
        self.stored: dict[str, list[Item]] = {}  # response id -> its whole history
        self._ids = itertools.count(1)

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests_to(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["path"] == path]

    async def _setup(self) -> None:
        await super()._setup()
        assert self._runner is not None
        router = self._runner.app.router
        router._frozen = False  # the same app, two more routes (before any request)
        router.add_post("/v1/messages", self._messages)
        router.add_post("/v1/messages/count_tokens", self._count)
        router.add_post("/v1/responses", self._responses)

    async def _read(self, request: web.Request) -> Any:
        """The body, logged with its raw bytes (what a byte-for-byte check compares)."""
        raw = await request.read()
        body = json.loads(raw)
        self._log(request, body)
        with self._lock:
            self.requests[-1]["raw"] = raw
        return body

    async def _prelude(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        body = await self._read(request)
        if self.mode == "hang":
            try:
                await self._release.wait()  # type: ignore[union-attr]
            except asyncio.CancelledError:
                with self._lock:
                    self.cancelled += 1
                raise
        failure = None
        if self.mode == "error":
            error = {"type": "api_error", "message": f"fake failure {self.status}"}
            shape = (
                {"type": "error", "error": error}
                if request.path.startswith("/v1/messages")
                else {"error": {**error, "code": "fake", "param": None}}
            )
            failure = web.json_response(shape, status=self.status, headers={"x-fake": "yes"})
        return body, failure

    # --- Anthropic Messages -------------------------------------------------------------

    async def _count(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        return web.json_response({"input_tokens": len(json.dumps(body)) // 4})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body, failure = await self._prelude(request)
        if failure is not None:
            return failure
        content = self.anthropic_reply(body)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        message = {
            "id": f"msg_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 5},
        }
        if not body.get("stream"):
            return web.json_response(message)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in anthropic_events(message):
            data = json.dumps(event)
            await response.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
            if self.mode == "drop" and (event.get("delta") or {}).get("type") == "text_delta":
                await asyncio.sleep(0.05)
                request.transport.abort()  # type: ignore[union-attr]
                return response
        await response.write_eof()
        return response

    def anthropic_reply(self, body: dict[str, Any]) -> list[Item]:
        messages = body.get("messages") or []
        offered = {t.get("name") for t in body.get("tools") or ()}
        choice = (body.get("tool_choice") or {}).get("type")
        memory_ok = self.memory_tool in offered and choice != "none"
        user, result = "", None
        for message in messages:
            if message.get("role") != "user":
                continue
            content = message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if texts:
                user, result = texts[-1], None
            if results:
                result = _text(results[-1].get("content"))
        if result is not None and user.startswith("BOTH:"):
            return [_tool_use(user[5:].strip(), {"x": 1})]
        if result is not None:
            prefix = "From memory" if user.startswith("RECALL:") else "Tool said"
            return [{"type": "text", "text": f"{prefix}: {result}"}]
        if user.startswith("BOTH:") and memory_ok:
            name = user[5:].strip()
            return [_tool_use(self.memory_tool, {"query": name}), _tool_use(name, {"x": 1})]
        if user.startswith("RECALL:") and memory_ok:
            return [_tool_use(self.memory_tool, {"query": user[7:].strip()})]
        if user.startswith("APPTOOL:"):
            return [_tool_use(user[8:].strip(), {"x": 1})]
        echo = {"type": "text", "text": f"Echo: {user}"}
        if user.startswith("THINK:"):
            return [{"type": "thinking", "thinking": "hmm " * 3, "signature": "sig-1"}, echo]
        return [echo]

    # --- OpenAI Responses --------------------------------------------------------------

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body, failure = await self._prelude(request)
        if failure is not None:
            return failure
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return web.json_response(
                {"error": {"message": "no such response", "type": "invalid_request_error"}},
                status=400,
            )
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given
        history = [*self.stored.get(previous, []), *items] if previous else list(items)
        output = self.responses_output(body, history)
        number = next(self._ids)
        response = {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model", "fake"),
            "instructions": body.get("instructions"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "error": None,
            "incomplete_details": None,
            "metadata": {},
            "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
        }
        if body.get("store", True):
            self.stored[response["id"]] = [*history, *output]
        if not body.get("stream"):
            return web.json_response(response)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for event in responses_events(response):
            data = json.dumps(event)
            await stream.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
            if self.mode == "drop" and event["type"] == "response.output_text.delta":
                await asyncio.sleep(0.05)
                request.transport.abort()  # type: ignore[union-attr]
                return stream
        await stream.write_eof()
        return stream

    def responses_output(self, body: dict[str, Any], history: list[Item]) -> list[Item]:
        offered = {t.get("name") for t in body.get("tools") or ()}
        memory_ok = self.memory_tool in offered and body.get("tool_choice") != "none"
        user, result = "", None
        for item in history:
            if item.get("type", "message") == "message" and item.get("role") == "user":
                user, result = _text(item.get("content")), None
            elif item.get("type") == "function_call_output":
                result = _text(item.get("output"))
        n = next(self._ids)
        if result is not None and user.startswith("BOTH:"):
            return [_function_call(n, user[5:].strip(), {"x": 1})]
        if user.startswith("BOTH:") and memory_ok and result is None:
            name = user[5:].strip()
            return [
                _function_call(n, self.memory_tool, {"query": name}),
                _function_call(n + 1000, name, {"x": 1}),
            ]
        if result is not None:
            prefix = "From memory" if user.startswith("RECALL:") else "Tool said"
            return [_message(n, f"{prefix}: {result}")]
        if user.startswith("RECALL:") and memory_ok:
            return [_function_call(n, self.memory_tool, {"query": user[7:].strip()})]
        if user.startswith("APPTOOL:"):
            return [_function_call(n, user[8:].strip(), {"x": 1})]
        return [_message(n, f"Echo: {user}")]


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _tool_use(name: str, args: dict[str, Any]) -> Item:
    return {"type": "tool_use", "id": f"toolu_{name}_{time.time_ns()}", "name": name, "input": args}


def _message(n: int, text: str) -> Item:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": f"msg_{n}",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def _function_call(n: int, name: str, args: dict[str, Any]) -> Item:
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": json.dumps(args),
        "status": "completed",
    }


def _block_events(i: int, block: Item) -> list[Item]:
    """One content block as its start, deltas and stop events."""

    def delta(d: Item) -> Item:
        return {"type": "content_block_delta", "index": i, "delta": d}

    if block["type"] == "text":
        shown: Item = {**block, "text": ""}
        text = block["text"]
        deltas = [
            delta({"type": "text_delta", "text": text[j : j + 4]}) for j in range(0, len(text), 4)
        ]
    elif block["type"] == "thinking":
        shown = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            delta({"type": "thinking_delta", "thinking": block["thinking"]}),
            delta({"type": "signature_delta", "signature": block["signature"]}),
        ]
    else:
        shown = {**block, "input": {}}
        args = json.dumps(block["input"])
        half = len(args) // 2
        pieces = (args[:half], args[half:])
        deltas = [delta({"type": "input_json_delta", "partial_json": p}) for p in pieces]
    start = {"type": "content_block_start", "index": i, "content_block": shown}
    return [start, *deltas, {"type": "content_block_stop", "index": i}]


def anthropic_events(message: dict[str, Any]) -> list[Item]:
    start = {**message, "content": [], "stop_reason": None}
    events: list[Item] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for i, block in enumerate(message["content"]):
        events += _block_events(i, block)
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append({"type": "message_delta", "delta": stop, "usage": {"output_tokens": 5}})
    events.append({"type": "message_stop"})
    return events


def _item_events(i: int, item: Item) -> list[Item]:
    """One output item as its added, content or argument, and done events."""
    if item["type"] == "message":
        text = item["content"][0]["text"]
        added = {**item, "content": [], "status": "in_progress"}
        part = {"type": "output_text", "text": "", "annotations": []}
        common = {"item_id": item["id"], "output_index": i, "content_index": 0}
        body = [
            {"type": "response.content_part.added", **common, "part": part},
            *(
                {
                    "type": "response.output_text.delta",
                    **common,
                    "delta": text[j : j + 4],
                    "logprobs": [],
                }
                for j in range(0, len(text), 4)
            ),
            {"type": "response.output_text.done", **common, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **common, "part": {**part, "text": text}},
        ]
    else:
        added = {**item, "arguments": "", "status": "in_progress"}
        common = {"item_id": item["id"], "output_index": i}
        args = item["arguments"]
        body = [
            {"type": "response.function_call_arguments.delta", **common, "delta": args},
            {"type": "response.function_call_arguments.done", **common, "arguments": args},
        ]
    return [
        {"type": "response.output_item.added", "output_index": i, "item": added},
        *body,
        {"type": "response.output_item.done", "output_index": i, "item": item},
    ]


def responses_events(response: dict[str, Any]) -> list[Item]:
    pending = {**response, "status": "in_progress", "output": []}
    events: list[Item] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for i, item in enumerate(response["output"]):
        events += _item_events(i, item)
    events.append({"type": "response.completed", "response": response})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]
