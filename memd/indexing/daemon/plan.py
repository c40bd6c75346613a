"""A client's index plan: everything memd derives from (client, config), derived once.

`ClientPlan.of(config, layout)` computes the collection, the Milvus target, the socket
and data paths, the `.memsearch.toml`, the index spec and the index server's command
line in one go; the pipeline, maintenance, catch-up and the leftovers check read the
plan instead of recomputing each from the config per call. The watcher's and the
catch-up child's command lines also need the embedding endpoint, which memd starts
itself (its loopback port changes every run): the plan builds them on request.

Scale-out mode (a Milvus URI in the config) has no index server: `index_server` is None.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memd.config import Config, EmbeddingConfig
from memd.indexing import analysis, embedding
from memd.indexing import children as programs
from memd.indexing.daemon.settings import (
    TOKEN_ENV,
    Command,
    IndexSettings,
    IndexSpec,
    collection_name,
    index_socket_path,
    milvus_data_dir,
    watcher_env,
)
from memd.indexing.targets import (
    Endpoint,
    IndexTarget,
    effective_model,
    uses_embedded_model,
    watcher_embedding,
)
from memd.layout import ClientLayout


@dataclass(frozen=True)
class ClientPlan:
    """What memd runs to keep one client's memory indexed, for one config."""

    layout: ClientLayout
    embedding: EmbeddingConfig
    settings: IndexSettings
    target: IndexTarget
    data_dir: Path
    index_socket: Path
    spec: IndexSpec
    memsearch_toml: Mapping[str, Any]
    index_server: Command | None  # None in scale-out mode, where the server is remote

    @classmethod
    def of(
        cls, config: Config, layout: ClientLayout, settings: IndexSettings | None = None
    ) -> ClientPlan:
        settings = settings or IndexSettings()
        target = _target(config, layout)
        return cls(
            layout=layout,
            embedding=config.embedding,
            settings=settings,
            target=target,
            data_dir=milvus_data_dir(layout),
            index_socket=index_socket_path(layout),
            spec=_spec(config.embedding, target, layout),
            memsearch_toml=_memsearch_toml(config.embedding, target, settings),
            index_server=_index_server(layout) if target.local else None,
        )

    @property
    def client_id(self) -> str:
        return self.layout.client_id

    @property
    def batch_size(self) -> int:
        return int(self.memsearch_toml["embedding"]["batch_size"])

    def watcher(self, endpoint: Endpoint | None = None) -> Command:
        """`memsearch watch` on the client's sessions/, run from the client root.

        The working directory matters: memsearch reads `.memsearch.toml` from the current
        directory. Secrets never appear in argv (readable by every local user via /proc):
        the provider key is in the variable the provider reads, the Milvus token is passed
        as `env:MEMD_MILVUS_TOKEN`, which memsearch resolves.
        """
        emb = watcher_embedding(self.embedding, endpoint)
        argv = [sys.executable, "-m", programs.WATCHER, "watch", str(self.layout.sessions)]
        argv += ["--provider", emb.provider, "--model", emb.model]
        argv += ["--milvus-uri", self.target.uri, "--collection", self.target.collection]
        if emb.base_url and emb.provider == "openai":
            argv += ["--base-url", emb.base_url]
        if self.target.token:
            argv += ["--milvus-token", f"env:{TOKEN_ENV}"]
        env = watcher_env(self.layout, emb, self.target)
        return Command(tuple(argv), env, self.layout.root)

    def catch_up(self, endpoint: Endpoint | None, since: float, run: str) -> Command:
        """The catch-up child's command: the watcher's provider, target and environment."""
        emb = watcher_embedding(self.embedding, endpoint)
        argv = [sys.executable, "-m", programs.CATCH_UP, "--sessions", str(self.layout.sessions)]
        argv += ["--since", repr(since), "--run", run, "--client", self.client_id]
        argv += ["--provider", emb.provider, "--model", emb.model]
        argv += ["--milvus-uri", self.target.uri, "--collection", self.target.collection]
        argv += ["--batch-size", str(self.batch_size)]
        argv += ["--max-chunk-size", str(self.settings.max_chunk_size)]
        argv += ["--overlap-lines", str(self.settings.overlap_lines)]
        if emb.base_url:
            argv += ["--base-url", emb.base_url]
        env = watcher_env(self.layout, emb, self.target)
        return Command(tuple(argv), env, self.layout.root)


def _target(config: Config, layout: ClientLayout) -> IndexTarget:
    """Where the watcher writes and recall reads this client's chunks."""
    collection = collection_name(layout.client_id)
    if not config.milvus.uri:  # local mode: the client's own index server
        return IndexTarget(f"unix:{index_socket_path(layout)}", collection)
    return IndexTarget(config.milvus.uri, collection, config.milvus.token, local=False)


def _spec(cfg: EmbeddingConfig, target: IndexTarget, layout: ClientLayout) -> IndexSpec:
    embedded = uses_embedded_model(cfg)
    model = effective_model(cfg)
    return IndexSpec(
        provider=cfg.provider,
        model=model,
        dimension=embedding.MODELS[model].dimension if embedded else None,
        base_url="" if embedded else cfg.base_url,  # memd serves it: no URL
        target="local" if target.local else target.uri,
        collection=target.collection,
        analyzer=analysis.ANALYZER_NAME,
        sessions=str(layout.sessions.resolve()),  # as memsearch names the rows' files
    )


def _memsearch_toml(
    cfg: EmbeddingConfig, target: IndexTarget, settings: IndexSettings
) -> dict[str, Any]:
    """The client's `.memsearch.toml` as a dict (the lead writes it with tomli-w)."""
    batch = settings.batch_size or (64 if uses_embedded_model(cfg) else 0)
    # Every trusted key is set, so no value can come from the user's global config either.
    return {
        "milvus": {"collection": target.collection},
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


def _index_server(layout: ClientLayout) -> Command:
    """The client's own index server (local mode)."""
    argv = [sys.executable, "-m", programs.INDEX_SERVER]
    argv += ["--data-dir", str(milvus_data_dir(layout))]
    argv += ["--socket", str(index_socket_path(layout))]
    return Command(tuple(argv), server_env(), layout.root)


def server_env() -> dict[str, str]:
    """memd's environment for an index server (a client's own or the shared one).

    Milvus Lite builds its segments with pyarrow, whose default pool (mimalloc) kept
    ~90 MB resident per server under bench/load.py while pyarrow held ~3 MB; on the
    system allocator that memory follows memd.heap's arena cap and trims instead.
    """
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return env


# -- the per-call forms, for callers that hold a config and a layout ---------------------


def index_target(config: Config, layout: ClientLayout) -> IndexTarget:
    return _target(config, layout)


def index_spec(config: Config, layout: ClientLayout) -> IndexSpec:
    return _spec(config.embedding, _target(config, layout), layout)


def memsearch_toml(
    config: Config, layout: ClientLayout, settings: IndexSettings | None = None
) -> dict[str, Any]:
    settings = settings or IndexSettings()
    return _memsearch_toml(config.embedding, _target(config, layout), settings)


def index_server_command(config: Config, layout: ClientLayout) -> Command | None:
    """The local index server; None in scale-out mode, where the Milvus server is remote."""
    return ClientPlan.of(config, layout).index_server


def watcher_command(
    config: Config, layout: ClientLayout, endpoint: Endpoint | None = None
) -> Command:
    return ClientPlan.of(config, layout).watcher(endpoint)
