"""Which index a client's chunks live in and which model embeds them.

Shared by memd's two sides of indexing: the daemon side (`memd.indexing.daemon`) builds
the children's command lines from these values, and recall's query path
(`memd.indexing.query`) embeds queries and reads the index with the very same ones, so a
query is embedded by the model that embedded the chunks. Pure values and functions: no
import of memsearch, pymilvus or the daemon side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memd.config import EmbeddingConfig
from memd.indexing import embedding

DEFAULT_PROVIDER = "minilm"  # memd.indexing.embedding; "wordllama" is the other bundled one
OPENAI_BASE_URL = "https://api.openai.com/v1"
# memsearch's provider for memd's bundled models, straight to the embedder child's socket
# (memd.indexing.engine.embedder_provider), named to it in this variable.
MEMD_PROVIDER = "memd"
EMBEDDER_SOCKET_ENV = "MEMD_EMBEDDER_SOCKET"

# memsearch's default models, so the fingerprint names the model actually used.
MEMSEARCH_DEFAULT_MODELS = {
    "openai": "text-embedding-3-small",
    "google": "gemini-embedding-001",
    "voyage": "voyage-3-lite",
    "jina": "jina-embeddings-v4",
    "mistral": "mistral-embed",
    "ollama": "nomic-embed-text",
    "local": "all-MiniLM-L6-v2",
    "onnx": "gpahal/bge-m3-onnx-int8",
}


@dataclass(frozen=True)
class IndexTarget:
    """Where a client's chunks live: a Milvus URI (unix: socket or server) and a collection."""

    uri: str
    collection: str
    token: str = field(default="", repr=False)
    local: bool = True


@dataclass(frozen=True)
class Endpoint:
    """What a watcher needs to reach memd's bundled models: the embedder child's socket
    (memsearch's `memd` provider) and the model. (An OpenAI-compatible URL and key were
    the other way, for memd's HTTP endpoint, which is gone.)"""

    model: str
    socket: str


@dataclass(frozen=True)
class WatcherEmbedding:
    """The memsearch provider settings a watcher runs with."""

    provider: str
    model: str
    base_url: str = ""
    api_key: str = field(default="", repr=False)
    socket: str = ""  # the embedder child's, for the memd provider


def uses_embedded_model(cfg: EmbeddingConfig) -> bool:
    """A model memd bundles and serves itself (memd.indexing.embedding.PROVIDERS)."""
    return cfg.provider in embedding.PROVIDERS


def effective_model(cfg: EmbeddingConfig) -> str:
    if uses_embedded_model(cfg):
        return embedding.PROVIDERS[cfg.provider]
    return cfg.model or MEMSEARCH_DEFAULT_MODELS.get(cfg.provider, "")


def watcher_embedding(cfg: EmbeddingConfig, endpoint: Endpoint | None) -> WatcherEmbedding:
    """An embedded model is reached through the embedder child's socket (memsearch's
    `memd` provider); any other provider as configured."""
    if uses_embedded_model(cfg):
        if endpoint is None:
            raise ValueError("the embedded model needs memd's embedder child (its socket)")
        return WatcherEmbedding(MEMD_PROVIDER, effective_model(cfg), socket=endpoint.socket)
    base_url = cfg.base_url
    if cfg.provider == "openai" and not base_url:
        base_url = OPENAI_BASE_URL  # explicit, so no OPENAI_BASE_URL variable can redirect it
    return WatcherEmbedding(cfg.provider, effective_model(cfg), base_url, cfg.api_key)
