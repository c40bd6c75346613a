"""Milvus Lite searches with visibility reused per generation (memd.indexing.engine.lite_search)
return what Lite's own code returns: over several segments, upserted and deleted keys,
filters, both the dense and the BM25 path, and again after every change.

Lite's own code is what answers a search that names a partition (the cache is skipped
then), so the same search with `partition_names=["_default"]`, where every row lives, is
the reference. A real Milvus Lite engine in the test's process, with memd's analyzers and
patches installed as the index server installs them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memd.indexing import analysis, engine
from memd.indexing.children.query_server import Requests
from memd.indexing.engine import lite_search

DIM = 8
WORDS = [
    "heron",
    "lake",
    "kettle",
    "garden",
    "hose",
    "bicycle",
    "bell",
    "river",
    "stone",
    "maple",
    "tea",
    "boat",
]


@pytest.fixture
def lite_db(tmp_path: Path) -> Iterator[Any]:
    """A Milvus Lite database holding collection "c" (see `coll`)."""
    engine.prepare_index_server()
    from milvus_lite.db import MilvusLite
    from milvus_lite.schema.types import (
        CollectionSchema,
        DataType,
        FieldSchema,
        Function,
        FunctionType,
    )

    fields = [
        FieldSchema("pk", DataType.VARCHAR, is_primary=True, max_length=64),
        FieldSchema(
            "content",
            DataType.VARCHAR,
            max_length=4096,
            enable_analyzer=True,
            analyzer_params=analysis.ANALYZER_PARAMS,
        ),
        FieldSchema("sparse_vector", DataType.SPARSE_FLOAT_VECTOR, is_function_output=True),
        FieldSchema("embedding", DataType.FLOAT_VECTOR, dim=DIM),
        FieldSchema("line", DataType.INT64),
    ]
    bm25 = Function("bm25", FunctionType.BM25, ["content"], ["sparse_vector"])
    db = MilvusLite(str(tmp_path / "milvus"))
    c = db.create_collection("c", CollectionSchema(fields, functions=[bm25]))
    c.create_index("embedding", {"index_type": "FLAT", "metric_type": "COSINE"})
    c.create_index("sparse_vector", {"index_type": "SPARSE_INVERTED_INDEX", "metric_type": "BM25"})
    c.load()
    yield db
    db.close()


@pytest.fixture
def coll(lite_db: Any) -> Any:
    return lite_db.get_collection("c")


def _rows(rng: random.Random, keys: range, version: int) -> list[dict[str, Any]]:
    return [
        {
            "pk": f"k{k}",
            "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))),
            "embedding": [rng.uniform(-1, 1) for _ in range(DIM)],
            "line": k * 10 + version,
        }
        for k in keys
    ]


def _both(coll: Any, **search: Any) -> tuple[list[Any], list[Any]]:
    fast = coll.search(**search)
    own = coll.search(partition_names=["_default"], **search)
    return fast, own


def _same(fast: list[Any], own: list[Any]) -> None:
    assert [[h["id"] for h in hits] for hits in fast] == [[h["id"] for h in hits] for hits in own]
    for f_hits, o_hits in zip(fast, own, strict=True):
        for f, o in zip(f_hits, o_hits, strict=True):
            assert f["distance"] == pytest.approx(o["distance"], rel=1e-5, abs=1e-6)
            assert f["entity"] == o["entity"]


def _check_searches(coll: Any, rng: random.Random) -> None:
    # A compaction between the two searches of a pair would change BM25's statistics
    # (it drops shadowed rows, which Lite counts until then): let it finish first.
    coll._wait_for_bg()
    for expr in (None, "line > 150"):
        vector = [rng.uniform(-1, 1) for _ in range(DIM)]
        dense = {"anns_field": "embedding", "metric_type": "COSINE"}
        _same(*_both(coll, query_vectors=[vector], top_k=7, expr=expr, **dense))
        for words in ("herons lake", "the kettle bells", "maple boats river stone"):
            sparse = {"anns_field": "sparse_vector", "metric_type": "BM25"}
            found = _both(
                coll, query_vectors=[words], top_k=7, expr=expr, output_fields=["line"], **sparse
            )
            _same(*found)


def test_cached_visibility_answers_as_lite_over_segments_upserts_and_deletes(coll: Any) -> None:
    rng = random.Random(3)
    coll.insert(_rows(rng, range(0, 40), 0))
    coll.flush()
    coll.insert(_rows(rng, range(40, 80), 0))
    coll.flush()
    _check_searches(coll, rng)
    assert getattr(coll, "_memd_visible", None) is not None  # the cached path answered

    coll.upsert(_rows(rng, range(10, 30), 1))  # newer versions in a third segment
    coll.flush()
    _check_searches(coll, rng)
    coll.delete([f"k{k}" for k in range(20, 50)])
    coll.flush()
    _check_searches(coll, rng)

    for round_ in range(2, 7):  # small segments, until Lite compacts them in the background
        coll.upsert(_rows(rng, range(round_ * 5, round_ * 5 + 8), round_))
        coll.flush()
        _check_searches(coll, rng)
    coll._wait_for_bg()
    assert len(coll._segment_cache) < 9  # some were merged: segments came and went
    _check_searches(coll, rng)

    found = coll.search(
        query_vectors=["heron lake kettle garden hose bicycle bell river stone maple tea boat"],
        top_k=100,
        anns_field="sparse_vector",
        metric_type="BM25",
        output_fields=["line"],
    )
    ids = {h["id"] for h in found[0]}
    assert not ids & {f"k{k}" for k in range(38, 50)}  # deleted keys stay deleted
    lines = {h["id"]: h["entity"]["line"] for h in found[0]}
    assert (lines["k12"], lines["k33"], lines["k70"]) == (122, 336, 700)  # newest versions


def test_rows_still_in_the_memtable_are_found_by_lite_own_code(coll: Any) -> None:
    rng = random.Random(5)
    coll.insert(_rows(rng, range(0, 30), 0))
    coll.flush()
    coll.search(query_vectors=["heron"], top_k=5, anns_field="sparse_vector", metric_type="BM25")
    coll.insert([{"pk": "fresh", "content": "zebra", "embedding": [1.0] * DIM, "line": 1}])
    coll.delete(["k0"])  # pending in the memtable, not yet a tombstone
    found = coll.search(
        query_vectors=["zebra"], top_k=5, anns_field="sparse_vector", metric_type="BM25"
    )
    assert [h["id"] for h in found[0]] == ["fresh"]
    dense = coll.search(
        query_vectors=[[1.0] * DIM], top_k=40, anns_field="embedding", metric_type="COSINE"
    )
    ids = [h["id"] for h in dense[0]]
    assert ids[0] == "fresh" and "k0" not in ids


def test_a_search_does_not_wait_for_a_compaction_holding_the_lock(coll: Any) -> None:
    """Lite's background compaction holds the maintenance lock while it merges segments;
    a search then answers from the snapshot taken right after the last flush, which holds
    every flushed row, instead of waiting."""
    import threading

    rng = random.Random(9)
    coll.insert(_rows(rng, range(0, 20), 0))
    coll.flush()
    coll.search(query_vectors=["heron"], top_k=3, anns_field="sparse_vector", metric_type="BM25")
    coll.insert([{"pk": "late", "content": "zebra crossing", "embedding": [1.0] * DIM, "line": 7}])
    coll.flush()
    coll._wait_for_bg()
    held, done, released = threading.Event(), threading.Event(), threading.Event()

    def compaction() -> None:
        with coll._maintenance_lock:
            held.set()
            done.wait(60)  # a safety bound only: the search below must not need it
        released.set()

    holder = threading.Thread(target=compaction)
    holder.start()
    held.wait()
    try:
        found = coll.search(
            query_vectors=["zebra"], top_k=3, anns_field="sparse_vector", metric_type="BM25"
        )
        nearest = coll.search(
            query_vectors=[[1.0] * DIM], top_k=1, anns_field="embedding", metric_type="COSINE"
        )
        answered_while_held = not released.is_set()
    finally:
        done.set()
        holder.join()
    assert answered_while_held
    assert [h["id"] for h in found[0]] == ["late"]
    assert [h["id"] for h in nearest[0]] == ["late"]


def _cosines_of_bm25_hits(db: Any, vector: list[float], words: str) -> dict[str, float]:
    """What recall's two halves in one request answer of the BM25 hits' cosines."""
    fields = ["pk", "line"]
    dense = {"data": vector, "anns_field": "embedding", "metric_type": "COSINE", "limit": 3}
    sparse = {"data": words, "anns_field": "sparse_vector", "metric_type": "BM25", "limit": 20}
    request = {"op": "searches", "collection": "c", "known": "pk", "cosines": True}
    searches = [{**dense, "output_fields": fields}, {**sparse, "output_fields": fields}]
    first, second = Requests(db).run({**request, "searches": searches})
    shown = {h["entity"]["pk"] for h in first}
    assert all(len(h["entity"]) == 1 for h in second if h["entity"]["pk"] in shown)
    return {h["entity"]["pk"]: h["entity"]["cosine"] for h in second if len(h["entity"]) > 1}


def test_bm25_hits_get_the_cosine_a_dense_search_gives_them(lite_db: Any, coll: Any) -> None:
    """Recall's BM25 hits come with their cosine to the query, computed by the index
    server from its cached unit vectors (or, while rows sit in the memtable, by a dense
    search over those rows): the same number a dense search over every row reports."""
    rng = random.Random(11)
    coll.insert(_rows(rng, range(0, 40), 0))
    coll.flush()
    coll._wait_for_bg()
    vector = [rng.uniform(-1, 1) for _ in range(DIM)]

    def dense_distances() -> dict[str, float]:
        every = coll.search(
            query_vectors=[vector], top_k=100, anns_field="embedding", metric_type="COSINE"
        )
        return {h["id"]: h["distance"] for h in every[0]}

    settled = _cosines_of_bm25_hits(lite_db, vector, "heron lake kettle")
    assert len(settled) > 5
    assert settled == pytest.approx({k: dense_distances()[k] for k in settled}, abs=1e-5)
    away = [-x for x in vector]  # cosine -1: never among the dense half's best
    coll.insert([{"pk": "fresh", "content": "heron heron", "embedding": away, "line": 1}])
    fresh = _cosines_of_bm25_hits(lite_db, vector, "heron lake kettle")  # from the memtable
    assert fresh["fresh"] == pytest.approx(-1.0, abs=1e-5)
    assert fresh == pytest.approx({k: dense_distances()[k] for k in fresh}, abs=1e-5)


@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=6),
        min_size=1,
        max_size=4,
    ),
    st.integers(min_value=1, max_value=6),
)
def test_segments_best_merge_as_lite_merges_them_ties_included(
    parts: list[list[int]], top_k: int
) -> None:
    """`_best` orders the segments' hits as the Python merge it replaced: the dense path
    sorted (distance, segment, row) tuples, the sparse path stable-sorted by distance;
    distances drawn from four values, so ties are the rule."""
    found = []
    for source, dists in enumerate(parts):
        ids = np.full((1, top_k), -1, dtype=np.int64)
        out = np.full((1, top_k), np.inf, dtype=np.float32)
        kept = sorted(dists)[:top_k]
        ids[0, : len(kept)] = [7 * (len(kept) - i) for i in range(len(kept))]  # rows unordered
        out[0, : len(kept)] = kept
        found.append((source, ids, out))
    tuples = [
        (float(out[0, j]), source, int(ids[0, j]))
        for source, ids, out in found
        for j in range(top_k)
        if ids[0, j] >= 0
    ]
    assert lite_search._best(found, 0, top_k, True) == sorted(tuples)[:top_k]
    by_distance = sorted(tuples, key=lambda t: t[0])[:top_k]
    assert lite_search._best(found, 0, top_k, False) == by_distance
