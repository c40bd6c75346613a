"""memsearch's `memd` embedding provider: the embedder child's socket, no OpenAI SDK.

The watchers and the catch-up children embed memd's bundled models in the embedder child
(`memd.indexing.children.embedder`). They used to reach it through memsearch's `openai`
provider and memd's OpenAI-compatible HTTP endpoint, which made the zygote preload the
whole SDK (openai, pydantic, httpx: ~30 MB PSS of the idle tree, issue 29) only to call a
local relay. This provider sends the texts to the child's socket itself
(`EmbedderClient`), so a watcher forked from the zygote never imports the SDK; a client
configured with a real `openai` provider imports it after the fork as before.

memsearch picks a provider by name in `memsearch.core.get_provider` (no fixed list in its
config or CLI): the patch answers `memd` there and hands every other name on. The socket
comes from `MEMD_EMBEDDER_SOCKET` (`settings.watcher_env`); the model name is the one the
HTTP path used, so chunk ids and memd's index spec do not change (no rebuild on upgrade).

An embedder that is down or restarting raises `EmbedderUnavailable` after `WAIT` seconds,
as the SDK gave up after the relay's 503s: memsearch's watcher logs the failed file and
goes on, and the catch-up run after the child's restart (its pid is in the catch-up key)
indexes it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from memd.indexing import embedding
from memd.indexing.engine.registry import Registry
from memd.indexing.query.embedder_client import EmbedderClient
from memd.indexing.targets import EMBEDDER_SOCKET_ENV, MEMD_PROVIDER

GROUP = "memsearch.memd_provider"
# Seconds a batch waits for a restarting embedder: about what the HTTP route allowed (the
# relay waited 3 s, then answered 503, which the SDK retried twice after ~1 s each).
WAIT = 10.0
DEFAULT_BATCH_SIZE = 64  # memd's batch for its bundled models (plan._memsearch_toml)
SPLIT_AT = 16  # a batch of this many texts or more goes out in two halves at once


class MemdEmbedding:
    """memsearch's `EmbeddingProvider` over the embedder child's socket."""

    def __init__(self, socket_path: Path, model: str, batch_size: int = 0) -> None:
        if model not in embedding.MODELS:
            raise ValueError(f"the embedder serves no model {model!r}")
        self._model = model
        self._dimension = embedding.MODELS[model].dimension
        self._batch_size = batch_size if batch_size > 0 else DEFAULT_BATCH_SIZE
        self._client = EmbedderClient(socket_path, wait=WAIT)

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def batch_size(self) -> int:
        return self._batch_size

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Batch by batch; each call in a thread, so memsearch's event loop is not blocked."""
        out: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            out += await self._embed_batch(texts[start : start + self._batch_size])
        return out

    async def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        """A big batch in two halves on two connections, which the embedder serves in two
        threads (as memd's old HTTP endpoint split it over two threads): a lone watcher's
        burst uses both cores. A text's vector does not depend on its batch."""
        if len(texts) < SPLIT_AT:
            return await asyncio.to_thread(self._client.embed, texts, self._model)
        half = len(texts) // 2
        first, second = await asyncio.gather(
            asyncio.to_thread(self._client.embed, texts[:half], self._model),
            asyncio.to_thread(self._client.embed, texts[half:], self._model),
        )
        return first + second


def provider(model: str | None, batch_size: int = 0, socket: str | None = None) -> MemdEmbedding:
    """The provider for `model` on `socket` (memsearch's base URL, for in-process callers
    such as `maintenance.catch_up`), else on the socket memd named in the environment."""
    path = socket or os.environ.get(EMBEDDER_SOCKET_ENV)
    if not path:
        raise ValueError(f"the memd provider needs {EMBEDDER_SOCKET_ENV} (set by memd)")
    return MemdEmbedding(Path(path), model or embedding.MODEL_NAME, batch_size)


def install(registry: Registry) -> None:
    """Make memsearch's `get_provider("memd", ...)` answer with `MemdEmbedding`."""
    import memsearch.core

    get_provider = registry.original(memsearch.core, "get_provider")

    def get_provider_with_memd(name: str = "openai", **kwargs: Any) -> Any:
        """memsearch's factory, plus memd's own provider."""
        if name == MEMD_PROVIDER:
            model, batch = kwargs.get("model"), kwargs.get("batch_size", 0)
            return provider(model, batch, kwargs.get("base_url"))
        return get_provider(name, **kwargs)

    registry.replace(GROUP, memsearch.core, "get_provider", get_provider_with_memd)
