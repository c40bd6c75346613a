"""Collection-wide BM25 statistics for Milvus Lite, as a Milvus server keeps them.

Milvus Lite 3.2.2 scores BM25 in each segment (and its unflushed memtable) with that
part's own document count, average length and document frequencies (a TODO in its
`engine/collection.py`), so the same chunk scores differently depending on which part
it landed in, and the ranking of a client's memories depends on when Lite flushed. A
Milvus server uses statistics of the whole collection. `install` (the index server's
second patch, `memd.indexing.engine.roles`, over the cached-visibility search of
`lite_search`) makes Lite do the same: a BM25 search first sums the parts' statistics
for the query's terms, then every part scores with those sums.

Measured on the LoCoMo dev split (bench/locomo.py): the daemon's recall@5 moved by up to a
point between runs of the same data with per-part statistics, and matches BM25 computed
over the whole collection once they are shared (docs/quality.md).
"""

from __future__ import annotations

import contextvars
import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from memd.indexing.engine.registry import Registry

_STATS: contextvars.ContextVar[_Stats | None] = contextvars.ContextVar("memd_bm25", default=None)


@dataclass(frozen=True)
class _Stats:
    """Document count, total length and document frequency of the query's terms."""

    docs: int
    length: float
    df: dict[int, int]

    @property
    def avgdl(self) -> float:
        return self.length / self.docs if self.docs else 0.0


GROUP = "lite.global_bm25"


def install(registry: Registry) -> None:
    """Patch Lite's BM25 search to use collection-wide statistics."""
    from milvus_lite.engine.collection import Collection
    from milvus_lite.index.sparse_inverted import SparseInvertedIndex

    original_search = registry.original(Collection, "_search_sparse")
    original_score = registry.original(SparseInvertedIndex, "search")

    signature = inspect.signature(original_search)

    def search_sparse(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = signature.bind(self, *args, **kwargs)
        given = call.arguments
        if str(given.get("metric_type", "")).upper() != "BM25":
            return original_search(self, *args, **kwargs)
        stats = _collection_stats(
            self, given["query_vectors"], given["vector_field"], given.get("partition_names")
        )
        token = _STATS.set(stats)
        try:
            return original_search(self, *args, **kwargs)
        finally:
            _STATS.reset(token)

    def score(self: Any, queries: Any, top_k: int, valid_mask: Any = None) -> Any:
        stats = _STATS.get()
        if stats is None or stats.docs == 0:
            return original_score(self, queries, top_k, valid_mask=valid_mask)
        return _score_with(self, stats, queries, top_k, valid_mask)

    registry.replace(GROUP, Collection, "_search_sparse", search_sparse)
    registry.replace(GROUP, SparseInvertedIndex, "search", score)


def _collection_stats(coll: Any, query_vectors: Any, field: str, partitions: Any) -> _Stats:
    """Sum the statistics of every segment (building its cached index as Lite's search
    would) and of the memtable, for the query's term hashes."""
    from milvus_lite.analyzer.sparse import bytes_to_sparse
    from milvus_lite.index.sparse_factory import create_sparse_index, sparse_index_matches

    queries = coll._prepare_sparse_queries(query_vectors, field)
    wanted = {h for q in queries for h in q}
    spec = coll._index_specs.get(field)
    params = spec.build_params if spec else {}
    only = set(partitions) if partitions else None
    docs, length, df = 0, 0.0, dict.fromkeys(wanted, 0)
    segments, _deltas = coll._read_snapshot()
    for seg in segments:
        if only is not None and seg.partition not in only:
            continue
        table = seg.table
        if table is None or len(table) == 0:
            continue
        index = seg.sparse_indexes.get(field)
        if not sparse_index_matches(index, "BM25", params):
            rows = table.column(field).to_pylist()
            index = create_sparse_index("BM25", params)
            index.build([bytes_to_sparse(r) if isinstance(r, bytes) else (r or {}) for r in rows])
            seg.sparse_indexes[field] = index
        docs += index.doc_count
        length += index.avgdl * index.doc_count
        for h in wanted:
            df[h] += index._df.get(h, 0)
    for _pk, _seq, record in coll._memtable.active_record_snapshots(partition_names=partitions):
        raw = record.get(field)
        vec = bytes_to_sparse(raw) if isinstance(raw, bytes) else (raw or {})
        docs += 1
        length += sum(vec.values())
        for h in wanted & vec.keys():
            df[h] += 1
    return _Stats(docs, length, df)


def _score_with(index: Any, stats: _Stats, queries: Any, top_k: int, valid_mask: Any) -> Any:
    """Lite's SparseInvertedIndex.search with the collection's statistics.

    Same arithmetic as Lite's loop (term by term, in the query's order), on numpy arrays
    of each posting list, built once per index: the per-posting Python loop was most of
    a BM25 search at 10k chunks (bench/recall.py --questions)."""
    from milvus_lite.index.sparse_common import empty_results, validate_mask

    valid_mask = validate_mask(valid_mask, len(index._doc_lengths))
    all_ids, all_dists = empty_results(len(queries), top_k)
    if index.doc_count == 0:
        return all_ids, all_dists
    postings = _Postings.of(index)
    n, k1, b = stats.docs, index.k1, index.b
    avgdl = stats.avgdl or 1.0
    norm = k1 * (1.0 - b + b * postings.lengths / avgdl)
    for qi, query in enumerate(queries):
        scores = np.zeros(len(postings.lengths))
        matched = np.zeros(len(postings.lengths), dtype=bool)
        for term, weight in query.items():
            ids, tf = postings.get(term)
            if not ids.size:
                continue
            df = max(stats.df.get(term, 0), 1)
            idf = math.log((n - df + 0.5) / (df + 0.5) + 1.0)
            scores[ids] += idf * tf * (k1 + 1.0) / (tf + norm[ids]) * weight
            matched[ids] = True
        if valid_mask is not None:
            matched &= valid_mask
        hits = np.flatnonzero(matched)
        best = hits[np.argsort(-scores[hits], kind="stable")[:top_k]]
        all_ids[qi, : len(best)] = best
        all_dists[qi, : len(best)] = -scores[best]
    return all_ids, all_dists


class _Postings:
    """One sparse index's posting lists as numpy arrays (document ids, term frequencies)
    and its document lengths, built on first use and kept on the index."""

    def __init__(self, index: Any) -> None:
        self.source = index._posting_lists  # Lite's build() replaces it: then rebuild
        self.lengths = np.asarray(index._doc_lengths, dtype=np.float64)
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def of(cls, index: Any) -> _Postings:
        cached: _Postings | None = getattr(index, "_memd_postings", None)
        if cached is None or cached.source is not index._posting_lists:
            cached = cls(index)
            index._memd_postings = cached
        return cached

    def get(self, term: int) -> tuple[np.ndarray, np.ndarray]:
        arrays = self._arrays.get(term)
        if arrays is None:
            posting = self.source.get(term) or ()
            ids = np.fromiter((i for i, _tf in posting), dtype=np.int64, count=len(posting))
            tf = np.fromiter((t for _i, t in posting), dtype=np.float64, count=len(posting))
            arrays = self._arrays[term] = (ids, tf)
        return arrays
