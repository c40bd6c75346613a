"""An OpenAI-compatible `POST /v1/embeddings` endpoint on loopback that serves memd's model.

Watchers are unmodified `memsearch watch` processes. They reach the embedded default model
through memsearch's `openai` provider pointed at this server, so the daemon holds the only
copy of the model and watchers and recall embed with exactly the same code.

The server listens on 127.0.0.1 on a random port, and every request must carry the random
bearer key made for this run (other local users can reach loopback ports). It sets
TCP_NODELAY on each connection: `http.server` writes headers and body separately, and with
Nagle's algorithm plus delayed ACKs each call took ~46 ms instead of ~2.4 ms. A peer that
sends nothing for IDLE_TIMEOUT seconds is dropped and at most MAX_WORKERS connections are
served at once (docs/security.md).
"""

from __future__ import annotations

import base64
import hmac
import json
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from memd.indexing import embedding

log = structlog.get_logger()

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_INPUTS = 2048
IDLE_TIMEOUT = 5.0  # seconds a connection may wait between bytes of its request
MAX_WORKERS = 32  # connections served at once; 2 watchers per core send one at a time

Embedder = Callable[[list[str]], list[list[float]]]


class RequestError(Exception):
    """A request this server refuses, with the HTTP status and OpenAI error type to answer."""

    def __init__(self, status: HTTPStatus, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class Endpoint:
    """What a watcher needs to reach the server: base URL (ending in /v1), key and model."""

    base_url: str
    api_key: str
    model: str


def parse_request(body: bytes, model: str) -> tuple[list[str], str]:
    """Validate an embeddings request; return its texts and the encoding format asked for."""
    try:
        req = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {exc}") from None
    if not isinstance(req, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    if req.get("model") != model:
        raise RequestError(
            HTTPStatus.NOT_FOUND,
            f"model {req.get('model')!r} is not served here; use {model!r}",
            "model_not_found",
        )
    texts = req.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise RequestError(HTTPStatus.BAD_REQUEST, "input must be a string or a list of strings")
    if not texts or len(texts) > MAX_INPUTS:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"input must hold 1 to {MAX_INPUTS} strings")
    fmt = req.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise RequestError(HTTPStatus.BAD_REQUEST, "encoding_format must be float or base64")
    return texts, fmt


def response_body(vectors: list[list[float]], model: str, fmt: str, tokens: int) -> bytes:
    """The OpenAI response shape; base64 is little-endian float32, as the SDK decodes it."""
    import numpy as np

    def encode(vec: list[float]) -> Any:
        if fmt == "base64":
            return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
        return vec

    data = [
        {"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()


class _Handler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0 semantics, `Connection: close`).

    Keep-alive breaks `memsearch watch`: its initial index runs under `asyncio.run()`, the
    openai SDK pools that connection, and the first file event (on another event loop)
    then fails with "Event loop is closed" and is lost. A fresh loopback connection per
    call costs well under a millisecond.
    """

    protocol_version = "HTTP/1.0"
    server: _Server
    timeout = IDLE_TIMEOUT  # socket timeout: a peer that sends nothing is dropped

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """http.server would print every request to stderr; memd logs only failures."""

    def do_POST(self) -> None:
        try:
            self._check_auth()
            if self.path.rstrip("/") != "/v1/embeddings":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {self.path}")
            texts, fmt = parse_request(self._read_body(), self.server.model)
            vectors = self.server.embedder(texts)
            tokens = sum(len(t.split()) for t in texts)
            self._send(HTTPStatus.OK, response_body(vectors, self.server.model, fmt, tokens))
        except RequestError as exc:
            self._send_error(exc)
        except Exception as exc:
            log.exception("embedding.request_failed")
            failure = RequestError(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc), "server_error")
            self._send_error(failure)

    def do_GET(self) -> None:
        try:
            self._check_auth()
            if self.path.rstrip("/") != "/v1/models":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {self.path}")
            body = {
                "object": "list",
                "data": [{"id": self.server.model, "object": "model", "owned_by": "memd"}],
            }
            self._send(HTTPStatus.OK, json.dumps(body).encode())
        except RequestError as exc:
            self._send_error(exc)

    def _check_auth(self) -> None:
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {self.server.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise RequestError(HTTPStatus.UNAUTHORIZED, "invalid API key", "invalid_api_key")

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        return self.rfile.read(length)

    def _send_error(self, exc: RequestError) -> None:
        if exc.status >= 500:
            log.warning("embedding.request_error", status=int(exc.status), error=str(exc))
        body = {"error": {"message": str(exc), "type": exc.kind, "code": exc.kind}}
        self._send(exc.status, json.dumps(body).encode())

    def _send(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    """One thread per connection, but at most MAX_WORKERS: a connection past that is
    closed at once (the openai SDK in the watcher retries), so idle peers on the loopback
    port pin a bounded number of threads and fds (1,239 of them had pinned 384 threads)."""

    daemon_threads = True
    allow_reuse_address = False
    _workers = threading.BoundedSemaphore(1)  # replaced per instance in __init__

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._workers.acquire(blocking=False):
            log.warning("embedding_server_busy", workers=MAX_WORKERS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._workers.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._workers.release()

    def __init__(self, addr: tuple[str, int], api_key: str, model: str, embedder: Embedder):
        self._workers = threading.BoundedSemaphore(MAX_WORKERS)
        self.api_key = api_key
        self.model = model
        self.embedder = embedder
        super().__init__(addr, _Handler)


class EmbeddingServer:
    """Lifecycle of the endpoint: `start()` binds and serves in a thread, `stop()` closes it."""

    def __init__(
        self,
        embedder: Embedder | None = None,
        model: str = embedding.MODEL_NAME,
        api_key: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._embedder = embedder or embedding.embed
        self._model = model
        self._api_key = api_key or secrets.token_urlsafe(32)
        self._host = host
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> Endpoint:
        if self._server is None:
            raise RuntimeError("embedding server is not started")
        port = self._server.server_address[1]
        return Endpoint(f"http://{self._host}:{port}/v1", self._api_key, self._model)

    def start(self) -> Endpoint:
        """Bind a random loopback port and serve (the model is loaded first, not on a call)."""
        if self._server is not None:
            return self.endpoint
        self._embedder(["warm up"])
        self._server = _Server((self._host, 0), self._api_key, self._model, self._embedder)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="memd-embed-server", daemon=True
        )
        self._thread.start()
        log.info("embedding.server_started", url=self.endpoint.base_url, model=self._model)
        return self.endpoint

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None
        log.info("embedding.server_stopped")

    def __enter__(self) -> EmbeddingServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
