"""An OpenAI-compatible `POST /v1/embeddings` endpoint on loopback that serves memd's model.

The daemon no longer starts it: its watchers reach the embedder child over its socket
(memsearch's `memd` provider, `memd.indexing.engine.embedder_provider`), without the
OpenAI SDK. Tests and `bench/embed_latency.py` still point memsearch's `openai` provider
at this server (an `Endpoint` without a socket). Given an `EmbedderClient`, the server
checks the key, the limits and the request, and relays the texts to the embedder child
(`memd.indexing.children.embedder`), which holds the only copy of the model. While the
embedder is down or restarting a request is answered 503 with `Retry-After: 1`, which the
OpenAI SDK retries.

The server listens on 127.0.0.1 on a random port, and every request must carry the random
bearer key made for this run (other local users can reach loopback ports). It runs on
aiohttp, the stack of `memd proxy`, on an event loop of its own thread. Its predecessor on
`http.server` needed TCP_NODELAY set by hand (headers and body went out as two writes:
with Nagle's algorithm plus delayed ACKs a call took ~46 ms instead of ~2.4 ms); asyncio
sets TCP_NODELAY on every TCP transport, and aiohttp sends a small answer in one write.
Connections cost no thread each (one event loop serves them all), and a peer that sends
nothing for IDLE_TIMEOUT seconds is dropped (docs/security.md).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import threading
from collections.abc import Callable, Collection
from http import HTTPStatus
from typing import Any, Protocol, runtime_checkable

import structlog
from aiohttp import web

from memd.indexing import embedding
from memd.indexing.index_requests import pack_vector
from memd.indexing.targets import Endpoint

log = structlog.get_logger()

IDLE_TIMEOUT = 5.0  # seconds an idle connection is kept open

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_INPUTS = 2048
SPLIT_AT = 16  # a request of this many texts or more is embedded in two threads

Embedder = Callable[[list[str]], list[list[float]]]
# What the server calls: texts and the model asked for.
_ModelEmbedder = Callable[[list[str], str], list[list[float]]]
RETRY_AFTER = "1"  # seconds the SDK waits before asking again while the embedder restarts


@runtime_checkable
class Models(Protocol):
    """Something serving every bundled model by name: `embedding.Embedder` (in-process) or
    `EmbedderClient` (the embedder child)."""

    def embed(self, texts: list[str], model: str = ...) -> list[list[float]]: ...


class RequestError(Exception):
    """A request this server refuses, with the HTTP status and OpenAI error type to answer."""

    def __init__(self, status: HTTPStatus, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


def parse_request(body: bytes, model: str | Collection[str]) -> tuple[list[str], str, str]:
    """Validate an embeddings request for one of the served models; return its texts, the
    model asked for and the encoding format asked for."""
    served = {model} if isinstance(model, str) else set(model)
    try:
        req = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {exc}") from None
    if not isinstance(req, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    asked = req.get("model")
    if not isinstance(asked, str) or asked not in served:
        raise RequestError(
            HTTPStatus.NOT_FOUND,
            f"model {asked!r} is not served here; use one of {sorted(served)}",
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
    return texts, asked, fmt


def response_body(vectors: list[list[float]], model: str, fmt: str, tokens: int) -> bytes:
    """The OpenAI response shape; base64 is little-endian float32, as the SDK decodes it
    (packed with the standard library: memd need not import numpy for it)."""

    def encode(vec: list[float]) -> Any:
        return pack_vector(vec)["f32"] if fmt == "base64" else vec

    data = [
        {"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()


class _App:
    """The routes. One request per connection (`Connection: close`).

    Keep-alive breaks `memsearch watch`: its initial index runs under `asyncio.run()`, the
    openai SDK pools that connection, and the first file event (on another event loop)
    then fails with "Event loop is closed" and is lost. A fresh loopback connection per
    call costs well under a millisecond.
    """

    def __init__(self, api_key: str, models: Collection[str], embedder: _ModelEmbedder) -> None:
        self.api_key = api_key
        self.served = sorted(models)
        self.embedder = embedder

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/{tail:.*}", self.missing)
        return app

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            self._check_auth(request)
            if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
            texts, model, fmt = parse_request(await request.read(), self.served)
            vectors = await self._embed(texts, model)
            tokens = sum(len(t.split()) for t in texts)
            return _send(HTTPStatus.OK, response_body(vectors, model, fmt, tokens))
        except RequestError as exc:
            return _send_error(exc)
        except (ConnectionError, TimeoutError) as exc:  # the embedder child is not answering
            unavailable = RequestError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), "server_error")
            return _send_error(unavailable, {"Retry-After": RETRY_AFTER})
        except web.HTTPRequestEntityTooLarge:
            return _send_error(
                RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
            )
        except Exception as exc:
            log.exception("embedding.request_failed")
            return _send_error(
                RequestError(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc), "server_error")
            )

    async def _embed(self, texts: list[str], model: str) -> list[list[float]]:
        """Embedding is CPU work: off the event loop, in threads. A watcher's batch (64
        texts) is split in two halves run at once: each model run uses one thread, so a
        lone watcher's burst would otherwise use one of the machine's cores (MiniLM:
        ~10 ms a text). A text's vector does not depend on its batch, so the split
        changes no vector."""
        loop = asyncio.get_running_loop()
        if len(texts) < SPLIT_AT:
            return await loop.run_in_executor(None, self.embedder, texts, model)
        half = len(texts) // 2
        parts = await asyncio.gather(
            loop.run_in_executor(None, self.embedder, texts[:half], model),
            loop.run_in_executor(None, self.embedder, texts[half:], model),
        )
        return parts[0] + parts[1]

    async def models(self, request: web.Request) -> web.Response:
        try:
            self._check_auth(request)
        except RequestError as exc:
            return _send_error(exc)
        body = {
            "object": "list",
            "data": [{"id": m, "object": "model", "owned_by": "memd"} for m in self.served],
        }
        return _send(HTTPStatus.OK, json.dumps(body).encode())

    async def missing(self, request: web.Request) -> web.Response:
        try:
            self._check_auth(request)
            raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {request.path}")
        except RequestError as exc:
            return _send_error(exc)

    def _check_auth(self, request: web.Request) -> None:
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise RequestError(HTTPStatus.UNAUTHORIZED, "invalid API key", "invalid_api_key")


def _send_error(exc: RequestError, headers: dict[str, str] | None = None) -> web.Response:
    if exc.status >= 500:
        log.warning("embedding.request_error", status=int(exc.status), error=str(exc))
    body = {"error": {"message": str(exc), "type": exc.kind, "code": exc.kind}}
    return _send(exc.status, json.dumps(body).encode(), headers)


def _send(status: HTTPStatus, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    response = web.Response(
        status=int(status), body=body, content_type="application/json", headers=headers
    )
    response.force_close()  # sends `Connection: close` and closes after the body
    return response


class EmbeddingServer:
    """Lifecycle of the endpoint: `start()` binds and serves on a thread's own event loop,
    `stop()` closes it (the callers are synchronous, and so is this API).

    Given `Models` (memd's `EmbedderClient` to the embedder child, an in-process
    `embedding.Embedder`, or nothing: an in-process one), it serves every bundled model
    by the name a request asks for, so one endpoint serves clients on either embedded
    provider; `endpoint.model` is the default one. Given any other callable, it serves
    that under `model` alone."""

    def __init__(
        self,
        embedder: Embedder | Models | None = None,
        model: str = embedding.MODEL_NAME,
        api_key: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        # An in-process model is loaded at start; the embedder child loads its own.
        remote = isinstance(embedder, Models) and not isinstance(embedder, embedding.Embedder)
        self._warm = not remote
        if embedder is None or isinstance(embedder, Models):
            models = embedder or embedding.Embedder()
            self._embedder: _ModelEmbedder = models.embed
            self._models: tuple[str, ...] = tuple(embedding.MODELS)
        else:
            plain = embedder
            self._embedder = lambda texts, _model: plain(texts)
            self._models = (model,)
        self._model = model
        self._api_key = api_key or secrets.token_urlsafe(32)
        self._host = host
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> Endpoint:
        if self._port is None:
            raise RuntimeError("embedding server is not started")
        return Endpoint(f"http://{self._host}:{self._port}/v1", self._api_key, self._model)

    def start(self) -> Endpoint:
        """Bind a random loopback port and serve (an in-process model is loaded first,
        not on a call)."""
        if self._port is not None:
            return self.endpoint
        if self._warm:
            self._embedder(["warm up"], self._model)
        loop = asyncio.new_event_loop()
        try:
            self._runner = loop.run_until_complete(self._listen())
        except BaseException:
            loop.close()
            raise
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="memd-embed-server", daemon=True
        )
        self._thread.start()
        log.info("embedding.server_started", url=self.endpoint.base_url, model=self._model)
        return self.endpoint

    async def _listen(self) -> web.AppRunner:
        app = _App(self._api_key, self._models, self._embedder).application()
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=1.0, keepalive_timeout=IDLE_TIMEOUT
        )
        await runner.setup()
        site = web.TCPSite(runner, self._host, 0)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._port = runner.addresses[0][1]
        return runner

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            loop.close()
            self._loop = self._runner = self._thread = None
            self._port = None
        log.info("embedding.server_stopped")

    def __enter__(self) -> EmbeddingServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
