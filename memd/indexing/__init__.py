"""Each client's index: settings, commands, index server, embeddings, rebuilds, search."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
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
        Hit,
        IndexSearcher,
        IndexUnavailableError,
        Section,
        expand_hit,
        in_range,
    )
    from memd.indexing.settings import (
        IndexTarget,
        collection_name,
        ensure_dirs,
        index_server_command,
        index_socket_path,
        index_spec,
        index_target,
        memsearch_toml,
        milvus_data_dir,
        watcher_command,
        watcher_home,
    )

__all__ = [
    "Hit",
    "IndexBusyError",
    "IndexSearcher",
    "IndexTarget",
    "IndexUnavailableError",
    "Pipelines",
    "Section",
    "catch_up",
    "collection_name",
    "ensure_dirs",
    "expand_hit",
    "in_range",
    "index_server_command",
    "index_socket_path",
    "index_spec",
    "index_target",
    "memsearch_toml",
    "milvus_data_dir",
    "needs_rebuild",
    "prepare_index",
    "read_spec",
    "rebuild",
    "watcher_command",
    "watcher_home",
    "watcher_ready",
    "write_spec",
]

__getattr__ = public_face(
    __name__,
    {
        "maintenance": (
            "IndexBusyError",
            "catch_up",
            "needs_rebuild",
            "prepare_index",
            "read_spec",
            "rebuild",
            "watcher_ready",
            "write_spec",
        ),
        "pipeline": ("Pipelines",),
        "search": (
            "Hit",
            "IndexSearcher",
            "IndexUnavailableError",
            "Section",
            "expand_hit",
            "in_range",
        ),
        "settings": (
            "IndexTarget",
            "collection_name",
            "ensure_dirs",
            "index_server_command",
            "index_socket_path",
            "index_spec",
            "index_target",
            "memsearch_toml",
            "milvus_data_dir",
            "watcher_command",
            "watcher_home",
        ),
    },
)
