"""One call per process role: check the engine's versions, patch it, prove the patches took.

Each child program calls its role's function once at start (`memd.indexing.children`),
before anything of memsearch or Milvus Lite runs. The order of a role's patches is fixed
here and matters: the collection-wide BM25 wraps the sparse search that cached
visibility installed, and both must be in place before the first analyzer is built.

Calling a role again is cheap and changes nothing (the registry applies each patch once);
only the index lock follows `MEMD_INDEX_LOCK` as it is at the call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from pathlib import Path

from memd import standins
from memd.indexing.engine.pins import check_versions
from memd.indexing.engine.registry import REGISTRY, Registry
from memd.indexing.index_lock import ENV as INDEX_LOCK_ENV

INDEX_SERVER = "index-server"
WATCHER = "watcher"
CATCH_UP = "catch-up"

Step = tuple[str, Callable[[Registry], None], Hashable]


def prepare_index_server(registry: Registry = REGISTRY) -> None:
    """Milvus Lite as memd serves it: searches reuse visibility per generation, BM25 uses
    collection-wide statistics, analyzers run all of memd's filters."""
    from memd.indexing.engine import lite_analyzers, lite_bm25, lite_search

    _prepare(
        registry,
        INDEX_SERVER,
        [
            (lite_search.GROUP, lite_search.install, None),
            (lite_bm25.GROUP, lite_bm25.install, None),
            (lite_analyzers.GROUP, lite_analyzers.install, None),
        ],
    )


def prepare_watcher(registry: Registry = REGISTRY) -> None:
    """`memsearch watch` as memd runs it: events one at a time, moves understood, memd's
    chunking, memd's embedding provider, no sleep before a new index is looked at, a
    changed chunk stored before its old version is deleted, and the client's index lock
    (if memd named one; it wraps the reordered indexing)."""
    from memd.indexing.engine import chunking, embedder_provider, index_order, index_wait, watcher

    steps: list[Step] = [
        (watcher.GROUP, watcher.install, None),
        (chunking.GROUP, chunking.install, None),
        (embedder_provider.GROUP, embedder_provider.install, None),
        (index_wait.GROUP, index_wait.install, None),
        (index_order.GROUP, index_order.install, None),
    ]
    _prepare(registry, WATCHER, steps + _index_lock_steps())


def prepare_catch_up(registry: Registry = REGISTRY) -> None:
    """memsearch's indexing as the watcher runs it: memd's chunking (so chunk ids agree),
    memd's embedding provider, no sleep before a new index is looked at, new chunks stored
    before stale ones are deleted, and the client's index lock (never beside the
    watcher's run on the same files)."""
    from memd.indexing.engine import chunking, embedder_provider, index_order, index_wait

    steps: list[Step] = [
        (chunking.GROUP, chunking.install, None),
        (embedder_provider.GROUP, embedder_provider.install, None),
        (index_wait.GROUP, index_wait.install, None),
        (index_order.GROUP, index_order.install, None),
    ]
    _prepare(registry, CATCH_UP, steps + _index_lock_steps())


def _index_lock_steps() -> list[Step]:
    from memd.indexing.engine import index_lock

    path = os.environ.get(INDEX_LOCK_ENV)
    return [(index_lock.GROUP, index_lock.installer(Path(path)), path)] if path else []


def _prepare(registry: Registry, role: str, steps: list[Step]) -> None:
    """Versions first (nothing is patched for another version), then the steps in order,
    then the self-check. EngineMismatch or PatchError on failure."""
    if role not in registry.roles:
        check_versions()
        standins.keep_out_of_pyarrow()
    for group, install, key in steps:
        registry.apply(group, install, key)
    registry.self_check()
    registry.roles.add(role)
