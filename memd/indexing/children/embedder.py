"""The embedder: memd's one copy of the bundled embedding models, served on a Unix socket.

memd used to load the model itself, for recall's query vectors and for the watchers'
OpenAI-compatible endpoint: ~80 MB of memd's ~130 MB PSS were onnxruntime, tokenizers,
google.protobuf and the ORT session (issue 29). This child holds them instead: the
watchers and catch-up children embed here through memsearch's `memd` provider
(`memd.indexing.engine.embedder_provider`), and recall asks here for its query vectors
(`memd.indexing.query.embedder_client`).

It is forked from the zygote like the index servers. The zygote imports tokenizers but
not onnxruntime: loading ORT's native module starts a thread (1.32: one, parked on a
futex), and the zygote must have none when it forks. So onnxruntime is imported here,
after the fork (~40 ms), and the ORT session (more threads) is made here too.

The socket speaks the index server's JSON lines (`memd.indexing.index_requests`, served
by `query_server.QueryServer`: 0600 in a private folder, other uids refused, a thread per
connection, a bad line answered with an error and the connection kept):

    {"op": "embed", "model": NAME, "texts": [...]} -> {"ok": true, "result": [{"f32": b64}, ...]}
    {"op": "embed", ..., "urgent": true}           -> the same, ahead of the others
    {"op": "ping"}                                   -> {"ok": true, "result": true}

Recall's query vectors are urgent (memd.indexing.daemon.embedder asks with `urgent`):
a user waits for them, while nobody waits for a watcher's chunk a few hundred ms. A
request that is not urgent is embedded SLICE texts at a time, and before each slice it
waits while any urgent one runs (`UrgentFirst`). Under bench/load.py (20 clients, 87
records and 37 recalls a second on 2 cores) the embedder was the busiest process (1.2
cores), and a recall's query waited its share behind 20 watchers' batches
(docs/performance.md, "Recall under load").

Connections run in parallel threads (onnxruntime's `run` lets go of the GIL); the
watchers' provider splits a batch of 16 texts or more over two connections, as memd's
endpoint did over two threads when the model lived in memd. The default model is loaded
before the socket is bound, so "the socket answers" (memd's readiness check) means "it
embeds".

Run: python -m memd.indexing.children.embedder --socket PATH [--model NAME]
SIGINT/SIGTERM: close the socket and exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from memd import trust
from memd.indexing import children, embedding
from memd.indexing.children import startup
from memd.indexing.children.query_server import QueryServer
from memd.indexing.index_requests import RequestError

log = structlog.get_logger()

MAX_TEXTS = 2048  # as memd's old HTTP endpoint allowed a request
SLICE = 4  # texts of a request that is not urgent embedded between two looks for urgent ones
YIELD_AT_MOST = 0.5  # seconds a slice waits for urgent requests: a steady stream of
# recalls slows indexing down, never stops it


def zygote_preload() -> None:
    """What memd's zygote imports before forking this: the tokenizer, not onnxruntime (its
    import starts a thread; see the module docstring)."""
    import numpy  # noqa: F401
    import tokenizers  # noqa: F401


class UrgentFirst:
    """Urgent requests run at once; the others wait their turn while any urgent one runs
    (at most YIELD_AT_MOST seconds a turn). Thread-safe: each connection is a thread."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._urgent = 0

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        with self._idle:
            self._urgent += 1
        try:
            yield
        finally:
            with self._idle:
                self._urgent -= 1
                if not self._urgent:
                    self._idle.notify_all()

    def wait_turn(self, at_most: float = YIELD_AT_MOST) -> bool:
        """Wait while an urgent request runs; False when `at_most` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._urgent == 0, timeout=at_most)


class EmbedRequests:
    """Runs one decoded request on the models (`QueryServer` calls `run` per line)."""

    def __init__(self, models: embedding.Embedder, order: UrgentFirst | None = None) -> None:
        self._models = models
        self._order = order or UrgentFirst()

    def run(self, request: Any) -> Any:
        if not isinstance(request, dict):
            raise RequestError("a request must be a JSON object")
        op = request.get("op")
        if op == "ping":
            return True
        if op != "embed":
            raise RequestError(f"unknown op {op!r}")
        model = request.get("model", embedding.MODEL_NAME)
        if not isinstance(model, str) or model not in embedding.MODELS:
            raise RequestError(f"no bundled embedding model {model!r}", "UnknownModel")
        texts = request.get("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError("'texts' must be a list of strings")
        if len(texts) > MAX_TEXTS:
            raise RequestError(f"at most {MAX_TEXTS} texts a request")
        if request.get("urgent") is True:
            with self._order.urgent():
                return self._models.embed(texts, model)
        out: list[list[float]] = []
        for start in range(0, len(texts), SLICE):
            self._order.wait_turn()
            out += self._models.embed(texts[start : start + SLICE], model)
        return out


def serve(socket_path: Path, model: str) -> int:
    """Load `model`, serve the socket until SIGINT/SIGTERM."""
    stop = startup.stop_event()
    models = embedding.Embedder()
    models.embed(["warm up"], model)  # loaded before anyone is told it is ready
    socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    trust.check_dir(socket_path.parent)  # the runtime dir may be under /tmp: ours alone
    server = QueryServer(socket_path, None, EmbedRequests(models))
    server.start()
    log.info("embedder.ready", socket=str(socket_path), model=model, pid=os.getpid())
    try:
        stop.wait()
    finally:
        server.stop()
    log.info("embedder.stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {children.EMBEDDER}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket path to serve on")
    parser.add_argument(
        "--model",
        default=embedding.MODEL_NAME,
        choices=sorted(embedding.MODELS),
        help="the model loaded at start (the others on first use)",
    )
    args = startup.start(children.EMBEDDER, parser, argv)
    return serve(args.socket.absolute(), args.model)


if __name__ == "__main__":
    sys.exit(main())
