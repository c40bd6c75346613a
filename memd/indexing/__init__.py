"""Each client's index: settings, commands, index server, embeddings, rebuilds, search."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.indexing.embed_server import EmbeddingServer, Endpoint
    from memd.indexing.embedding import (
        DIMENSION,
        MODEL_NAME,
        embed,
        embed_one,
        load_model,
        model,
        tokenizer_path,
        weights_path,
    )
    from memd.indexing.index_server import index_ready, serve
    from memd.indexing.maintenance import (
        IndexBusyError,
        catch_up,
        needs_rebuild,
        prepare_index,
        read_spec,
        rebuild,
        watcher_ready,
        write_spec,
    )
    from memd.indexing.pipeline import Pipelines
    from memd.indexing.search import (
        OUTPUT_FIELDS,
        Hit,
        IndexSearcher,
        IndexUnavailableError,
        exchange_time,
        expand_hit,
        in_range,
        time_filter_expr,
    )
    from memd.indexing.settings import (
        OPENAI_BASE_URL,
        Command,
        IndexSettings,
        IndexTarget,
        collection_name,
        ensure_dirs,
        index_server_command,
        index_socket_path,
        index_spec,
        index_target,
        is_dimension_mismatch,
        memsearch_toml,
        milvus_data_dir,
        watcher_command,
        watcher_home,
    )

__all__ = [
    "DIMENSION",
    "MODEL_NAME",
    "OPENAI_BASE_URL",
    "OUTPUT_FIELDS",
    "Command",
    "EmbeddingServer",
    "Endpoint",
    "Hit",
    "IndexBusyError",
    "IndexSearcher",
    "IndexSettings",
    "IndexTarget",
    "IndexUnavailableError",
    "Pipelines",
    "catch_up",
    "collection_name",
    "embed",
    "embed_one",
    "ensure_dirs",
    "exchange_time",
    "expand_hit",
    "in_range",
    "index_ready",
    "index_server_command",
    "index_socket_path",
    "index_spec",
    "index_target",
    "is_dimension_mismatch",
    "load_model",
    "memsearch_toml",
    "milvus_data_dir",
    "model",
    "needs_rebuild",
    "prepare_index",
    "read_spec",
    "rebuild",
    "serve",
    "time_filter_expr",
    "tokenizer_path",
    "watcher_command",
    "watcher_home",
    "watcher_ready",
    "weights_path",
    "write_spec",
]

__getattr__ = public_face(
    __name__,
    {
        "embed_server": (
            "Endpoint",
            "EmbeddingServer",
        ),
        "embedding": (
            "MODEL_NAME",
            "DIMENSION",
            "weights_path",
            "tokenizer_path",
            "load_model",
            "model",
            "embed",
            "embed_one",
        ),
        "index_server": (
            "index_ready",
            "serve",
        ),
        "pipeline": ("Pipelines",),
        "maintenance": (
            "watcher_ready",
            "catch_up",
            "read_spec",
            "write_spec",
            "needs_rebuild",
            "IndexBusyError",
            "rebuild",
            "prepare_index",
        ),
        "search": (
            "OUTPUT_FIELDS",
            "IndexUnavailableError",
            "Hit",
            "time_filter_expr",
            "in_range",
            "exchange_time",
            "IndexSearcher",
            "expand_hit",
        ),
        "settings": (
            "OPENAI_BASE_URL",
            "IndexSettings",
            "Command",
            "IndexTarget",
            "collection_name",
            "milvus_data_dir",
            "watcher_home",
            "index_socket_path",
            "index_target",
            "index_spec",
            "memsearch_toml",
            "index_server_command",
            "watcher_command",
            "ensure_dirs",
            "is_dimension_mismatch",
        ),
    },
)
