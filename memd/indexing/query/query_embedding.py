"""Embedding a recall query exactly as the client's watcher embeds its chunks.

memd's embedded models through the embedder child (`embedder_client`; in-process when no
client is given: tools and tests); any other provider through memsearch's own provider
classes, with the settings the watcher runs with (memd.indexing.targets).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import structlog

from memd.config import EmbeddingConfig
from memd.indexing import embedding
from memd.indexing.query.embedder_client import EmbedderClient, EmbedderUnavailable
from memd.indexing.targets import effective_model, uses_embedded_model, watcher_embedding

log = structlog.get_logger()


class QueryEmbedder:
    """Embeds queries exactly as the client's watcher embeds chunks.

    memsearch providers are async and their HTTP clients bind to the event loop they first
    ran on, so they get one private loop thread for their whole life (a fresh
    `asyncio.run` per call breaks them, as memsearch's own watcher notes).
    """

    def __init__(
        self, cfg: EmbeddingConfig, embedder: embedding.Embedder | EmbedderClient | None = None
    ) -> None:
        self._cfg = cfg
        self._embedded = embedder or embedding.Embedder()  # loads the model on first use
        self._provider: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def vector(self, text: str, timeout: float) -> list[float]:
        """The query's vector, or [] while the embedder child is down or restarting:
        recall then searches by keywords alone rather than failing (TimeoutError still
        raises: the recall's time is spent)."""
        try:
            return self.embed(text, timeout)
        except EmbedderUnavailable as exc:
            log.warning("recall.keyword_only", reason=str(exc))
            return []

    def embed(self, text: str, timeout: float) -> list[float]:
        if uses_embedded_model(self._cfg):
            model = effective_model(self._cfg)
            if isinstance(self._embedded, EmbedderClient):
                return self._embedded.embed_one(text, model, max(timeout, 0.01))
            return self._embedded.embed_one(text, model)
        provider, loop = self._ensure_provider()
        future = asyncio.run_coroutine_threadsafe(provider.embed([text]), loop)
        try:
            return list(future.result(timeout=max(timeout, 0.01))[0])
        except TimeoutError:
            future.cancel()
            raise

    def _ensure_provider(self) -> tuple[Any, asyncio.AbstractEventLoop]:
        with self._lock:
            if self._provider is None:
                self._provider = _memsearch_provider(self._cfg)
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="memd-query-embed", daemon=True
                ).start()
                self._loop = loop
            assert self._loop is not None
            return self._provider, self._loop

    def close(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None
            self._provider = None


def _memsearch_provider(cfg: EmbeddingConfig) -> Any:
    """memsearch's provider for cfg, with cfg's base URL honoured where memsearch has no
    parameter for it: its ollama provider reads OLLAMA_HOST, which memd sets only for the
    watcher (see indexing.watcher_env), so recall talks to the same host here."""
    emb = watcher_embedding(cfg, None)  # the very settings the watcher runs with
    if emb.provider == "ollama" and emb.base_url:
        return _OllamaQueryEmbedding(emb.model, emb.base_url)
    from memsearch.embeddings import get_provider

    return get_provider(
        emb.provider, model=emb.model, base_url=emb.base_url or None, api_key=emb.api_key or None
    )


class _OllamaQueryEmbedding:
    """memsearch's OllamaEmbedding.embed, against an explicit host."""

    def __init__(self, model: str, host: str) -> None:
        import ollama

        self._client = ollama.AsyncClient(host=host)
        self._model = model

    async def embed(self, texts: list[str]) -> list[list[float]]:
        result = await self._client.embed(model=self._model, input=texts)
        return result["embeddings"]
