"""What runs per client to keep its memory indexed: settings, command lines, rebuilds.

Pure functions from (Config, ClientLayout, embedding endpoint) to what memd spawns:

- the `.memsearch.toml` for the client (only the keys memsearch trusts from a project file:
  collection, embedding batch size, chunking, ignore rules, watch debounce);
- the index server (`python -m memd.indexing.index_server`) in local mode, one per client, serving
  the client's Milvus Lite database on a Unix socket; none in scale-out mode;
- the `memsearch watch` command: provider, model, base URL and Milvus URI on its command
  line (memsearch ignores them in a project file), secrets in its environment, HOME pointed
  at a memd-owned folder so the user's `~/.memsearch/config.toml` cannot leak in;
- an `IndexSpec`, the fingerprint of the embedding settings an index was built with, so a
  model change rebuilds the index from the markdown files instead of crash-looping on
  memsearch's dimension check.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from memd import trust
from memd.config import Config, EmbeddingConfig
from memd.indexing import analysis, embedding, index_lock
from memd.indexing.embed_server import Endpoint
from memd.layout import ClientLayout

log = structlog.get_logger()

DEFAULT_PROVIDER = "wordllama"  # memd.indexing.embedding; "minilm" is the other bundled one
OPENAI_BASE_URL = "https://api.openai.com/v1"
SOCKET_PATH_MAX = 100  # sun_path holds 107 bytes; keep a margin

# memsearch's default models, so the fingerprint names the model actually used.
_MEMSEARCH_DEFAULT_MODELS = {
    "openai": "text-embedding-3-small",
    "google": "gemini-embedding-001",
    "voyage": "voyage-3-lite",
    "jina": "jina-embeddings-v4",
    "mistral": "mistral-embed",
    "ollama": "nomic-embed-text",
    "local": "all-MiniLM-L6-v2",
    "onnx": "gpahal/bge-m3-onnx-int8",
}
# Where each memsearch provider reads its key when memsearch does not pass one on.
_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "google": "GOOGLE_API_KEY",
    "voyage": "VOYAGE_API_KEY",
    "jina": "JINA_API_KEY",
    "mistral": "MISTRAL_API_KEY",
}
# Variables that would redirect a watcher away from what memd configured: memsearch's
# openai provider falls back to OPENAI_BASE_URL when no base URL is given.
_STRIPPED_ENV = ("MEMSEARCH_DIR", "OPENAI_BASE_URL", "OLLAMA_HOST")
# Every provider SDK's own variables (keys, base URLs, organisation, Vertex switches):
# none reaches a watcher; the key it needs comes from memd's config (issue #14).
_SDK_ENV_PREFIXES = ("OPENAI_", "GOOGLE_", "GEMINI_", "VOYAGE_", "JINA_", "MISTRAL_", "ANTHROPIC_")
_TOKEN_ENV = "MEMD_MILVUS_TOKEN"


@dataclass(frozen=True)
class IndexSettings:
    """memd's values for memsearch's project-file keys.

    debounce_ms is short so that an exchange is searchable a second or so after it is
    written (the transcript writer appends a whole exchange at once and fsyncs it).
    """

    debounce_ms: int = 300
    max_chunk_size: int = 1500
    overlap_lines: int = 2
    batch_size: int = 0  # 0: the provider's default (memd's own endpoint: 64)
    ignore_files: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    """A program to run: argv, its whole environment, and its working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


@dataclass(frozen=True)
class IndexTarget:
    """Where a client's chunks live: a Milvus URI (unix: socket or server) and a collection."""

    uri: str
    collection: str
    token: str = field(default="", repr=False)
    local: bool = True


@dataclass(frozen=True)
class WatcherEmbedding:
    """The memsearch provider settings a watcher runs with."""

    provider: str
    model: str
    base_url: str = ""
    api_key: str = field(default="", repr=False)


@dataclass(frozen=True)
class IndexSpec:
    """Fingerprint of what an index was built with; any change means rebuild.

    base_url is left out for the embedded model (its loopback port changes every run).
    `analyzer` names the BM25 text analysis (memd.indexing.analysis): a spec recorded
    before it existed reads as "" and so rebuilds the index with the analyzer.
    """

    provider: str
    model: str
    dimension: int | None
    base_url: str
    target: str
    collection: str
    analyzer: str = ""


# -- names and paths ---------------------------------------------------------------------


def collection_name(client_id: str) -> str:
    """`memd_<client_id>` with anything Milvus refuses replaced by `_`.

    Milvus collection names are letters, digits and underscores. When replacing changed
    the id, a short hash keeps `a-b` and `a_b` apart.
    """
    safe = re.sub(r"[^A-Za-z0-9_]", "_", client_id)
    if safe != client_id:
        safe += "_" + hashlib.sha256(client_id.encode()).hexdigest()[:8]
    return f"memd_{safe}"


def milvus_data_dir(layout: ClientLayout) -> Path:
    """Milvus Lite data of the client; memsearch's `.index-state.json` sits beside it."""
    return layout.memsearch_dir / "milvus"


def spec_path(layout: ClientLayout) -> Path:
    return layout.state_dir / "index-spec.json"


def watcher_home(layout: ClientLayout) -> Path:
    """HOME of the client's watcher: empty, so memsearch finds no user config there."""
    return layout.state_dir / "home"


def index_socket_path(layout: ClientLayout) -> Path:
    """`<state_dir>/index.sock`, or a short path under the runtime dir when that is too long.

    A Unix socket path must fit in 107 bytes; deep memory_dirs (and pytest's tmp_path)
    exceed it. The fallback is per user and per client root, so it is stable across runs.
    """
    preferred = layout.state_dir / "index.sock"
    if len(os.fsencode(preferred)) <= SOCKET_PATH_MAX:
        return preferred
    digest = hashlib.sha256(os.fsencode(layout.root.absolute())).hexdigest()[:16]
    return runtime_dir() / f"index-{digest}.sock"


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"memd-{os.getuid()}"


def local_mode(config: Config) -> bool:
    return not config.milvus.uri


def index_target(config: Config, layout: ClientLayout) -> IndexTarget:
    """Where the watcher writes and recall reads this client's chunks."""
    collection = collection_name(layout.client_id)
    if local_mode(config):
        return IndexTarget(f"unix:{index_socket_path(layout)}", collection)
    return IndexTarget(config.milvus.uri, collection, config.milvus.token, local=False)


# -- embedding settings ------------------------------------------------------------------


def uses_embedded_model(cfg: EmbeddingConfig) -> bool:
    """A model memd bundles and serves itself (memd.indexing.embedding.PROVIDERS)."""
    return cfg.provider in embedding.PROVIDERS


def effective_model(cfg: EmbeddingConfig) -> str:
    if uses_embedded_model(cfg):
        return embedding.PROVIDERS[cfg.provider]
    return cfg.model or _MEMSEARCH_DEFAULT_MODELS.get(cfg.provider, "")


def watcher_embedding(cfg: EmbeddingConfig, endpoint: Endpoint | None) -> WatcherEmbedding:
    """An embedded model is reached through memd's OpenAI-compatible endpoint, which
    serves every bundled model by name."""
    if uses_embedded_model(cfg):
        if endpoint is None:
            raise ValueError("the embedded model needs memd's embedding endpoint")
        model = effective_model(cfg)
        return WatcherEmbedding("openai", model, endpoint.base_url, endpoint.api_key)
    base_url = cfg.base_url
    if cfg.provider == "openai" and not base_url:
        base_url = OPENAI_BASE_URL  # explicit, so no OPENAI_BASE_URL variable can redirect it
    return WatcherEmbedding(cfg.provider, effective_model(cfg), base_url, cfg.api_key)


def index_spec(config: Config, layout: ClientLayout) -> IndexSpec:
    cfg = config.embedding
    embedded = uses_embedded_model(cfg)
    target = index_target(config, layout)
    return IndexSpec(
        provider=cfg.provider,
        model=effective_model(cfg),
        dimension=embedding.MODELS[effective_model(cfg)].dimension if embedded else None,
        base_url="" if embedded else cfg.base_url,
        target="local" if target.local else target.uri,
        collection=target.collection,
        analyzer=analysis.ANALYZER_NAME,
    )


# -- generated files and command lines ---------------------------------------------------


def memsearch_toml(
    config: Config, layout: ClientLayout, settings: IndexSettings = IndexSettings()
) -> dict[str, Any]:
    """The client's `.memsearch.toml` as a dict (the lead writes it with tomli-w)."""
    batch = settings.batch_size or (64 if uses_embedded_model(config.embedding) else 0)
    # Every trusted key is set, so no value can come from the user's global config either.
    return {
        "milvus": {"collection": collection_name(layout.client_id)},
        "embedding": {"batch_size": batch},
        "chunking": {
            "max_chunk_size": settings.max_chunk_size,
            "overlap_lines": settings.overlap_lines,
        },
        "indexing": {
            "ignore_files": list(settings.ignore_files),
            "exclude": list(settings.exclude),
        },
        "watch": {"debounce_ms": settings.debounce_ms},
    }


def index_server_command(config: Config, layout: ClientLayout) -> Command | None:
    """The local index server; None in scale-out mode, where the Milvus server is remote."""
    if not local_mode(config):
        return None
    argv = (
        sys.executable,
        "-m",
        "memd.indexing.index_server",
        "--data-dir",
        str(milvus_data_dir(layout)),
        "--socket",
        str(index_socket_path(layout)),
    )
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # Milvus Lite builds its segments with pyarrow, whose default pool (mimalloc) kept
    # ~90 MB resident per server under bench/load.py while pyarrow held ~3 MB; on the
    # system allocator that memory follows memd.heap's arena cap and trims instead.
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return Command(argv, env, layout.root)


def watcher_command(
    config: Config, layout: ClientLayout, endpoint: Endpoint | None = None
) -> Command:
    """`memsearch watch` on the client's sessions/, run from the client root.

    The working directory matters: memsearch reads `.memsearch.toml` from the current
    directory. Secrets never appear in argv (readable by every local user via /proc):
    the provider key is in the variable the provider reads, the Milvus token is passed as
    `env:MEMD_MILVUS_TOKEN`, which memsearch resolves.
    """
    emb = watcher_embedding(config.embedding, endpoint)
    target = index_target(config, layout)
    argv = [
        sys.executable,
        "-m",
        "memd.indexing.memsearch_watch",
        "watch",
        str(layout.sessions),
        "--provider",
        emb.provider,
        "--model",
        emb.model,
        "--milvus-uri",
        target.uri,
        "--collection",
        target.collection,
    ]
    if emb.base_url and emb.provider == "openai":
        argv += ["--base-url", emb.base_url]
    if target.token:
        argv += ["--milvus-token", f"env:{_TOKEN_ENV}"]
    env = watcher_env(layout, emb, target, embedded=uses_embedded_model(config.embedding))
    return Command(tuple(argv), env, layout.root)


def watcher_env(
    layout: ClientLayout,
    emb: WatcherEmbedding,
    target: IndexTarget,
    *,
    embedded: bool = False,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """memd's environment with the watcher's HOME, key and endpoints set by memd.

    HOME moves to an empty memd-owned folder: memsearch resolves `~/.memsearch/config.toml`
    from HOME at import time. Model caches stay where they were (XDG_CACHE_HOME/HF_HOME
    pinned to the real ones) so local providers do not download per client.
    """
    env = dict(os.environ if base is None else base)
    real_cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    for name in [*_STRIPPED_ENV, *(n for n in env if n.startswith(_SDK_ENV_PREFIXES))]:
        env.pop(name, None)
    env["HOME"] = str(watcher_home(layout))
    env["XDG_CACHE_HOME"] = real_cache
    env.setdefault("HF_HOME", str(Path(real_cache) / "huggingface"))
    env["MEMSEARCH_DIR"] = str(layout.memsearch_dir)  # memsearch writes .index-state.json there
    env[index_lock.ENV] = str(index_lock.lock_path(layout))  # one indexing run at a time
    env["PYTHONUNBUFFERED"] = "1"
    loopback = "127.0.0.1,localhost,::1"
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = f"{env[name]},{loopback}" if env.get(name) else loopback
    key_env = _KEY_ENV.get(emb.provider)
    if emb.api_key and key_env:
        env[key_env] = emb.api_key
    elif emb.provider == "openai" and emb.base_url:
        env["OPENAI_API_KEY"] = "unused"  # the SDK refuses to start without one
    if emb.provider == "ollama" and emb.base_url:
        env["OLLAMA_HOST"] = emb.base_url
    if target.token:
        env[_TOKEN_ENV] = target.token
    return env


def ensure_dirs(layout: ClientLayout) -> None:
    """Folders the commands above expect (on top of `layout.ensure()`)."""
    layout.ensure()
    trust.ensure_dir(watcher_home(layout))
    sock_dir = index_socket_path(layout).parent
    sock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    trust.check_dir(sock_dir)  # the short fallback under /tmp must be ours alone
