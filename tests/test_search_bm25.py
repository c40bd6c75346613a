"""BM25 over the whole collection on Milvus Lite (memd.indexing.engine.lite_bm25): a chunk scores
the same whether Lite flushed it into a segment or still holds it in its memtable, as on a
Milvus server. A real index server on a Unix socket; pymilvus as recall uses it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from memd.indexing import analysis, embedding
from tests.support.children import Child
from tests.test_analysis import _rows
from tests.test_index_server import start_index_server


def _row(key: str, text: str) -> dict[str, Any]:
    [row] = _rows()[:1]
    return {**row, "chunk_hash": key, "content": text, "heading": key}


@pytest.mark.slow
def test_bm25_uses_collection_wide_statistics_across_segment_and_memtable(
    tmp_path: Path, short_tmp: Path, children: list[Child]
) -> None:
    from pymilvus import MilvusClient

    sock = short_tmp / "index.sock"
    start_index_server(children, tmp_path / "milvus", sock, tmp_path / "server.log")
    client = MilvusClient(uri=f"unix:{sock}", dedicated=True)
    try:
        analysis.create_collection(client, "c", embedding.DIMENSION)
        filler = ["tea kettle", "garden hose", "bicycle bell"]
        client.insert(
            "c", [_row("seg", "heron lake"), *[_row(f"f{i}", t) for i, t in enumerate(filler)]]
        )
        client.flush("c")  # these four become a segment
        client.insert("c", [_row("mem", "heron lake")])  # this one stays in the memtable
        res = client.search(
            collection_name="c",
            data=["herons"],
            anns_field="sparse_vector",
            search_params={"metric_type": "BM25"},
            limit=5,
            output_fields=["chunk_hash"],
        )
    finally:
        client.close()
    scores = {hit["entity"]["chunk_hash"]: abs(hit["distance"]) for hit in res[0]}
    assert set(scores) == {"seg", "mem"}
    # Both copies score with N = 5, df = 2 and the collection's mean length (2.2 terms).
    idf = math.log((5 - 2 + 0.5) / (2 + 0.5) + 1)
    k1, b, avgdl = 1.5, 0.75, 2.0  # Lite's default k1; every row has two terms
    expected = idf * (k1 + 1) / (1 + k1 * (1 - b + b * 2 / avgdl))
    assert scores["seg"] == pytest.approx(expected, rel=1e-4)
    assert scores["mem"] == pytest.approx(expected, rel=1e-4)


def test_analysis_is_safe_from_many_threads_at_once() -> None:
    """A Snowball stemmer holds the word it works on: threads sharing one failed
    (IndexError) on the Lite-over-TCP server while five watchers wrote at once."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [
        " ".join(f"nationalizing{i}x{j} runnings{i}y{j}" for j in range(50)) for i in range(64)
    ]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(analysis.terms, texts))
    assert together == [analysis.terms(t) for t in texts]
