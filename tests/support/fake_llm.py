"""A stand-in LLM: a real HTTP server on 127.0.0.1 speaking OpenAI's chat completions API.

`POST /v1/chat/completions` (OpenAI; base URL `base_url`) and, for the anthropic provider,
`POST /v1/messages` (Anthropic; base URL `root_url`).

Deterministic answers with `usage` counted as ceil(chars / 4) (or none, with
`report_usage = False`), a log of every request, a count of requests in flight, and the
failure modes compaction must survive: the port refusing connections (`go_down`), HTTP
errors (`mode="error"`, status 500/429/...), a reply that never comes (`mode="hang"`)
and empty content (`mode="empty"`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FACT_RE = re.compile(r"FACT-[A-Za-z0-9_]+")


def default_summary(prompt: str) -> str:
    """Names every `FACT-...` token it was shown, so a test can follow facts through merges."""
    facts = list(dict.fromkeys(FACT_RE.findall(prompt)))
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    lines = "\n".join(f"- {fact}" for fact in facts) or "- (no facts)"
    return f"Summary {digest} of {len(prompt)} chars.\n\n## Facts\n\n{lines}\n"


@dataclass
class LoggedRequest:
    path: str
    model: str
    prompt: str
    authorization: str
    status: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def prompt_chars(self) -> int:
        return len(self.prompt)


class FakeLLM:
    """Start with `with FakeLLM() as llm:`; point an OpenAI client at `llm.base_url`."""

    def __init__(self, *, summary: Callable[[str], str] = default_summary) -> None:
        self.summary = summary
        self.mode = "ok"  # ok | error | hang | empty
        self.status = 500
        self.retry_after_ms: int | None = None  # sent with errors, honoured by the OpenAI SDK
        self.hang_limit = 60.0  # a hung request is let go after this, or at stop()
        self.report_usage = True  # `usage` as ceil(chars / 4); False: an API that has none
        self.requests: list[LoggedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The Anthropic SDK appends /v1/messages itself."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeLLM:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_class(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._release.clear()
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-llm:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def go_down(self) -> None:
        """Close the port (connection refused) and every open connection."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        self._release.set()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        assert self._thread is not None
        self._thread.join(5)

    def come_up(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            self.start()

    def stop(self) -> None:
        self.go_down()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- behaviour ----------------------------------------------------------------------

    def set_mode(self, mode: str, *, status: int = 500) -> None:
        assert mode in ("ok", "error", "hang", "empty"), mode
        self.mode, self.status = mode, status
        if mode != "hang":
            self._release.set()
        else:
            self._release.clear()

    def prompts(self) -> list[str]:
        with self._lock:
            return [r.prompt for r in self.requests]

    def _enter(self, req: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(req)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _answer(self, req: LoggedRequest) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, JSON body and extra headers for one chat completion request."""
        mode = self.mode
        if mode == "hang":
            self._release.wait(self.hang_limit)
            mode = "ok" if self.mode == "hang" else self.mode
        anthropic = req.path.rstrip("/") == "/v1/messages"
        if mode == "error":
            headers = (
                {"retry-after-ms": str(self.retry_after_ms)}
                if self.retry_after_ms is not None
                else {}
            )
            body = {
                "error": {
                    "message": f"fake failure {self.status}",
                    "type": "server_error",
                    "code": None,
                }
            }
            return self.status, body, headers
        content = "" if mode == "empty" else self.summary(req.prompt)
        tokens = (_tokens(req.prompt), _tokens(content)) if self.report_usage else None
        if anthropic:
            return 200, _message(req.model, content, tokens), {}
        return 200, _completion(req.model, content, tokens), {}


def _tokens(text: str) -> int:
    """What the fake charges: one token per four characters, rounded up."""
    return -(-len(text) // 4)


def _completion(model: str, content: str, tokens: tuple[int, int] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "fake",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
    }
    if tokens is not None:
        body["usage"] = {
            "prompt_tokens": tokens[0],
            "completion_tokens": tokens[1],
            "total_tokens": sum(tokens),
        }
    return body


def _message(model: str, content: str, tokens: tuple[int, int] | None) -> dict[str, Any]:
    """An Anthropic Messages API answer (a thinking block first, as some models send)."""
    blocks = [{"type": "thinking", "thinking": "hmm", "signature": "sig"}]
    if content:
        blocks.append({"type": "text", "text": content})
    body: dict[str, Any] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model or "fake",
        "content": blocks,
        "stop_reason": "end_turn",
        "stop_sequence": None,
    }
    if tokens is not None:
        body["usage"] = {"input_tokens": tokens[0], "output_tokens": tokens[1]}
    return body


def _handler_class(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK expects
        disable_nagle_algorithm = True  # headers and body would otherwise wait ~40 ms

        def setup(self) -> None:
            super().setup()
            with fake._lock:
                fake._conns.add(self.connection)

        def finish(self) -> None:
            with fake._lock:
                fake._conns.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/v1/messages"):
                self._send(404, {"error": {"message": f"no route {self.path}"}}, {})
                return
            try:
                body = json.loads(raw)
                prompt = "\n".join(_text(m.get("content")) for m in body.get("messages", []))
            except (ValueError, AttributeError):
                self._send(400, {"error": {"message": "bad json"}}, {})
                return
            auth = self.headers.get("Authorization") or self.headers.get("x-api-key", "")
            req = LoggedRequest(self.path, str(body.get("model", "")), prompt, auth)
            fake._enter(req)
            try:
                status, payload, headers = fake._answer(req)
                req.status = status
            finally:
                fake._leave()
            self._send(status, payload, headers)

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (timeout) or the server went down

    return Handler


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def free_port() -> int:
    """A port nothing listens on (connection refused), for the unreachable case."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
