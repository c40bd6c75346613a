"""The two raw requests of a search, the one place recall talks to the index about ranking.

`halves` asks for both in one round trip when the query's vector is at hand;
`halves_while_embedding` sends the BM25 half while the query is still being embedded and
the dense half after it (`memd.indexing.query.search.IndexSearcher` chooses). Both hand
`ranking.fused_rows` the same rows: every dense hit whole, a BM25 hit the dense half did
not return with its `cosine` to the query's vector, computed by the index.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from memd.indexing.query.index_client import IndexClient, SearchRequest

OUTPUT_FIELDS = [
    "content",
    "source",
    "heading",
    "chunk_hash",
    "heading_level",
    "start_line",
    "end_line",
]


class IndexUnavailableError(Exception):
    """The client's index cannot be reached or did not answer in time (kind index_unavailable)."""


def halves(
    client: IndexClient,
    name: str,
    vector: list[float],
    query: str,
    pool: int,
    expr: str,
    deadline: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The two raw requests of a search: the best `pool` chunks by cosine similarity to
    `vector`, and by BM25 for `query` (each with its `cosine` to `vector`, computed by
    the index). No vector (the embedder is down): no dense half.

    Both go in one round trip (`IndexClient.searches`), and a BM25 hit the dense half
    found comes back as its `chunk_hash` alone: `ranking.fused_rows` takes its row and
    cosine from the dense half anyway. At 10k chunks this saved a round trip
    (docs/quality.md, "Recall latency"); the index computing the other hits' cosines,
    not memd from their embeddings, a fifth of memd's CPU time in a recall
    (docs/performance.md, "Recall latency, round 9")."""
    keyword = SearchRequest(query, "sparse_vector", "BM25", pool, OUTPUT_FIELDS, expr)
    if not vector:  # no dense half to ask (an empty vector: keywords alone)
        [hits] = client.searches(name, [keyword], known="chunk_hash", timeout=remaining(deadline))
        return [], hits
    dense = SearchRequest(vector, "embedding", "COSINE", pool, OUTPUT_FIELDS, expr)
    both = client.searches(name, [dense, keyword], known="chunk_hash", timeout=remaining(deadline))
    return both[0], both[1]


def halves_while_embedding(
    client: IndexClient,
    name: str,
    vector: Future[list[float]],
    query: str,
    pool: int,
    expr: str,
    deadline: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[float]]:
    """`halves`, the BM25 request sent while the query's `vector` is still being
    embedded, then the dense one with the cosines of the BM25 hits it did not return
    (`IndexClient.nearest`); also the vector ([]: no dense half, as in `halves`).

    Two round trips instead of one, but the BM25 half's ~40 % of the index server's work
    overlaps the embedding. The rows come out as `halves` gives them to
    `ranking.fused_rows`: every dense hit whole, a BM25 hit's `cosine` in its entity."""
    keyword = SearchRequest(query, "sparse_vector", "BM25", pool, OUTPUT_FIELDS, expr)
    [hits] = client.searches(name, [keyword], known="chunk_hash", timeout=remaining(deadline))
    got = vector_of(vector, deadline)
    if not got:
        return [], hits, got
    dense = SearchRequest(got, "embedding", "COSINE", pool, OUTPUT_FIELDS, expr)
    rows = {hit["entity"]["chunk_hash"]: hit["entity"] for hit in hits}
    found, cosines = client.nearest(
        name, dense, known="chunk_hash", have=list(rows), timeout=remaining(deadline)
    )
    for hit in found:  # a row the BM25 half brought came back as its key alone
        key = hit["entity"]["chunk_hash"]
        if key in rows:
            hit["entity"] = dict(rows[key])  # before any row gets its cosine below
    for key, cos in cosines.items():
        if key in rows:
            rows[key]["cosine"] = cos
    return found, hits, got


def vector_of(pending: Future[list[float]], deadline: float) -> list[float]:
    """The pending query vector, waited for no longer than the recall may take."""
    try:
        return pending.result(timeout=remaining(deadline))
    except FutureTimeout:
        raise IndexUnavailableError("embedding the query timed out") from None


def remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise IndexUnavailableError("index search timed out")
    return left
