"""A stand-in OpenAI-compatible upstream for the proxy: aiohttp on 127.0.0.1 in a thread.

It answers from the last message, so a test steers it through what the user says:

- `RECALL: <query>` with the memory tool offered: calls it with that query, and once the
  tool's result is in the history, answers `From memory: <result>`;
- `APPTOOL: <name>`: calls the app's tool `<name>`; `BOTH: <name>`: calls the memory
  tool and `<name>` in one reply, then (after the memory result) `<name>` alone;
- anything else: `Echo: <text>`.

Streams like OpenAI (role chunk, content in pieces, tool-call deltas, finish chunk,
usage when asked, `[DONE]`). Failure modes: `error` (status and body), `hang` (never
answers; a proxy that hangs up is counted in `cancelled`), and `drop` (cuts the
connection after the first content chunk, or mid-body when not streamed).

It also serves `POST /v1/embeddings` (float vectors from `embedder(texts, model)`), as
a remote embedding API that a client configured with `provider = "openai"` and a
`base_url` indexes with. Each answer closes its connection: memsearch's watcher lost its
first file event over a kept-alive one (memd's old endpoint answered the same way).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

MEMORY_TOOL = "MemoryRecall"


class FakeUpstream:
    """`with FakeUpstream() as fake:`; point the proxy (or an SDK) at `fake.base_url`."""

    def __init__(
        self,
        memory_tool: str = MEMORY_TOOL,
        embedder: Callable[[list[str], str], list[list[float]]] | None = None,
    ) -> None:
        self.memory_tool = memory_tool
        self.embedder = embedder
        self.mode = "ok"  # ok | error | hang | drop
        self.status = 500
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeUpstream:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), daemon=True, name="fake-openai"
        )
        self._thread.start()
        ready.wait(10)
        return self

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self._setup())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
        loop.close()

    async def _setup(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._release.set)  # type: ignore[union-attr]
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_mode(self, mode: str, status: int = 500) -> None:
        assert mode in ("ok", "error", "hang", "drop"), mode
        self.mode, self.status = mode, status

    def chat_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["path"] == "/v1/chat/completions"]

    # --- handlers -------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        self._log(request, None)
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}],
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._log(request, body)
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        assert self.embedder is not None, "FakeUpstream(embedder=...) serves embeddings"
        vectors = await asyncio.to_thread(self.embedder, texts, body["model"])
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        answer = {"object": "list", "data": data, "model": body["model"], "usage": usage}
        response = web.json_response(answer)
        response.force_close()
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self._log(request, body)
        if self.mode == "hang":
            try:
                await self._release.wait()  # type: ignore[union-attr]
            except asyncio.CancelledError:
                with self._lock:
                    self.cancelled += 1
                raise
        if self.mode == "error":
            return web.json_response(
                {
                    "error": {
                        "message": f"fake failure {self.status}",
                        "type": "server_error",
                        "code": "fake",
                    }
                },
                status=self.status,
                headers={"x-fake": "yes"},
            )
        message = self.reply(body)
        if body.get("stream"):
            return await self._stream(request, body, message)
        data = completion(body.get("model", ""), message)
        if self.mode == "drop":
            raw = json.dumps(data).encode()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(raw)
            await response.prepare(request)
            await response.write(raw[: len(raw) // 2])
            request.transport.abort()  # type: ignore[union-attr]
            return response
        return web.json_response(data)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], message: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in stream_chunks(
            body.get("model", ""),
            message,
            bool((body.get("stream_options") or {}).get("include_usage")),
        ):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if (
                self.mode == "drop"
                and chunk["choices"]
                and chunk["choices"][0]["delta"].get("content")
            ):
                await asyncio.sleep(0.05)
                request.transport.abort()  # type: ignore[union-attr]
                return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _log(self, request: web.Request, body: Any) -> None:
        with self._lock:
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.requests.append(
                {"path": request.path, "body": body, "headers": headers, "at": time.time()}
            )

    # --- the "model" ----------------------------------------------------------------

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        offered = {(t.get("function") or {}).get("name") for t in body.get("tools") or ()}
        user = next((text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
        last = messages[-1] if messages else {}
        results = [m for m in messages if m.get("role") == "tool"]
        memory_ok = self.memory_tool in offered and body.get("tool_choice") != "none"
        if last.get("role") == "tool":
            if user.startswith("BOTH:"):
                return _calls([(user[5:].strip(), {"x": 1})])
            if user.startswith("RECALL:"):
                return {"role": "assistant", "content": f"From memory: {text_of(last)}"}
            return {"role": "assistant", "content": f"Tool said: {text_of(last)}"}
        if user.startswith("RECALL:") and memory_ok and not results:
            return _calls([(self.memory_tool, {"query": user[7:].strip()})])
        if user.startswith("APPTOOL:"):
            return _calls([(user[8:].strip(), {"x": 1})])
        if user.startswith("BOTH:") and memory_ok:
            return _calls(
                [(self.memory_tool, {"query": user[5:].strip()}), (user[5:].strip(), {"x": 1})]
            )
        return {"role": "assistant", "content": f"Echo: {user}"}


def _calls(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(calls)
        ],
    }


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def completion(model: str, message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def stream_chunks(model: str, message: dict[str, Any], usage: bool) -> list[dict[str, Any]]:
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model or "fake-model",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    for i in range(0, len(text), 4):
        out.append(chunk({"content": text[i : i + 4]}))
    for index, call in enumerate(message.get("tool_calls") or ()):
        args = call["function"]["arguments"]
        half = len(args) // 2
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in (args[:half], args[half:]):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(chunk({}, "tool_calls" if message.get("tool_calls") else "stop"))
    if usage:
        out.append(
            {
                **base,
                "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )
    return out
