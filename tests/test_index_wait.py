"""A new collection's indexes through memd's index server, with `pymilvus.index_wait`.

pymilvus asked AllocTimestamp (which Milvus Lite does not implement: a traceback in the
index server's log) and slept before its first look at a new index; with memd's patch it
looks at once and finds the index built (issue 29: a new client's first watcher start).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memd.indexing import embedding, engine
from memd.indexing.engine import index_wait
from tests.support.children import Child
from tests.support.embedding import embed_one
from tests.test_index_server import _row, start_index_server


@pytest.mark.parametrize("patched", [True, False])
def test_a_new_collection_is_indexed_without_asking_a_timestamp(
    tmp_path: Path, short_tmp: Path, children: list[Child], patched: bool
) -> None:
    from memsearch.store import MilvusStore

    # A test that ran an in-process catch-up in this worker left the engine's patches
    # applied (index_wait among them): put the originals back, or the unpatched case is
    # patched too. A later test that needs them prepares its role again.
    engine.REGISTRY.reset()
    sock = short_tmp / "index.sock"
    server = start_index_server(children, tmp_path / "milvus", sock, tmp_path / "server.log")
    registry = engine.Registry()
    try:
        if patched:
            registry.apply(index_wait.GROUP, index_wait.install)
            registry.self_check()
        store = MilvusStore(
            f"unix:{sock}", collection="c", dimension=embedding.DIMENSION, _create_if_missing=True
        )
        store.upsert([_row(0, "the heron keeps the cabin key")])
        hits = store.search(embed_one("cabin key"), query_text="cabin key")
        assert hits and hits[0]["content"] == "the heron keeps the cabin key"
        store.close()
    finally:
        registry.reset()
    asked = "AllocTimestamp" in server.output()
    assert asked is not patched, server.output()[-2000:]
