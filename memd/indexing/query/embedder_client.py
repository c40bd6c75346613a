"""memd's side of the embedder child (`memd.indexing.children.embedder`): `embed(texts,
model)` as `memd.indexing.embedding.Embedder` has it, over the child's socket.

memd loads no model (issue 29: ~80 MB of its PSS were onnxruntime, tokenizers and the ORT
session): recall's `QueryEmbedder` embeds its queries through one of these, and the
watchers' memsearch provider (`memd.indexing.engine.embedder_provider`) their chunks.
The transport is the index server's JSON-lines client (`index_client.LiteIndexClient`):
kept connections, one request at a time on each, so two threads embedding at once use
two connections and the child runs them in parallel.

`EmbedderUnavailable` says the child is down or restarting (nothing accepts on the
socket, or it hung up): a watcher's `memd` provider raises it, so memsearch fails that
file (catch-up indexes it after the restart), and recall searches by keywords alone.
With `wait`, a call first waits up to that long for a restarting child to answer again.
"""

from __future__ import annotations

import time
from pathlib import Path

from memd.indexing import embedding
from memd.indexing.query.index_client import (
    IndexRequestError,
    IndexTransportError,
    LiteIndexClient,
)

DEFAULT_TIMEOUT = 120.0  # a watcher's batch on a busy machine; recall passes its deadline
RETRY_EVERY = 0.2  # seconds between looks for a restarting child (with `wait`)


class EmbedderUnavailable(ConnectionError):
    """The embedder child cannot be reached (down, restarting) or hung up."""


class EmbedderClient:
    """The embedder child, reached over its socket; thread-safe."""

    def __init__(
        self,
        socket_path: Path,
        *,
        wait: float = 0.0,
        timeout: float = DEFAULT_TIMEOUT,
        urgent: bool = False,
    ) -> None:
        """`urgent`: embedded ahead of the requests that are not (recall's queries ahead
        of the watchers' chunks: memd.indexing.children.embedder)."""
        self.socket_path = socket_path
        self.wait = wait
        self.timeout = timeout
        self.urgent = urgent
        self._client = LiteIndexClient(socket_path, keep=8)

    def embed(
        self, texts: list[str], model: str = embedding.MODEL_NAME, timeout: float | None = None
    ) -> list[list[float]]:
        """One unit-length vector per text. EmbedderUnavailable when the child cannot be
        reached (TimeoutError when it does not answer in time), ValueError when it refuses
        the request (an unknown model)."""
        if not texts:
            return []
        limit = self.timeout if timeout is None else timeout
        give_up = time.monotonic() + min(self.wait, limit)
        while True:
            try:
                fields: dict[str, object] = {"model": model, "texts": texts}
                if self.urgent:
                    fields["urgent"] = True
                result = self._client.request("embed", limit, **fields)
                return [list(v) for v in result]
            except IndexRequestError as exc:
                raise ValueError(f"the embedder refused the request: {exc}") from exc
            except IndexTransportError as exc:
                if isinstance(exc.__cause__, TimeoutError):
                    raise TimeoutError(f"the embedder did not answer in time: {exc}") from exc
                if time.monotonic() + RETRY_EVERY >= give_up:
                    raise EmbedderUnavailable(f"the embedder is not answering: {exc}") from exc
            time.sleep(RETRY_EVERY)

    def embed_one(
        self, text: str, model: str = embedding.MODEL_NAME, timeout: float | None = None
    ) -> list[float]:
        return self.embed([text], model, timeout)[0]

    def close(self) -> None:
        self._client.close()
