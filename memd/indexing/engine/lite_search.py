"""Milvus Lite searches without a pass over every row, once the collection is settled.

Milvus Lite 3.2.2 decides which rows a search may return (the newest version of each
primary key, not deleted) in Python loops over every row of every segment, on every
search, for the dense and the BM25 path alike; its brute-force cosine also normalises
every stored vector again each time. At 10k chunks that was ~40 ms of a ~65 ms search
pair (profile of the index server's engine on bench/recall.py --questions' data), the
largest part of recall's latency.

Those answers only change when the segments or the tombstones do. memd's index server
flushes after every write, so the memtable is nearly always empty; then the visible rows
of each segment (and its unit vectors) are computed once per generation (the same tuple
of immutable segments and the same tombstones, `lite_visibility`) and reused. Whenever
the memtable holds rows or deletes, or a search names partitions, Lite's own code runs
unchanged.

`install` (the index server's first patch, `memd.indexing.engine.roles`, before the
collection-wide BM25 of `lite_bm25` wraps the sparse search) patches
`Collection._search_sparse` and the dense executor. tests/test_lite_search.py checks
the results against Lite's own code over upserts, deletes, several segments and filters.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

from memd.indexing.engine.lite_visibility import (
    BUILDING,
    Generation,
    generation,
    search_snapshot,
)
from memd.indexing.engine.registry import Registry

log = structlog.get_logger()

_SEARCHING: contextvars.ContextVar[Any] = contextvars.ContextVar("memd_searching", default=None)


GROUP = "lite.cached_visibility"


def install(registry: Registry) -> None:
    """Patch Lite's dense and sparse search to reuse visibility per generation."""
    from milvus_lite.engine import collection as module

    cls = module.Collection
    _wrap_search(registry, cls, registry.original(cls, "search"))
    _wrap_dense(registry, module, registry.original(module, "execute_search_with_index"))
    _wrap_sparse(registry, cls, registry.original(cls, "_search_sparse"))
    _wrap_snapshots(registry, cls)
    _wrap_warm_up(registry, cls, registry.original(cls, "_ensure_loaded_segments_indexed"))


def _wrap_search(registry: Registry, cls: Any, search: Any) -> None:
    @functools.wraps(search)
    def collection_search(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _SEARCHING.set(self)  # the dense executor is not told its collection
        try:
            return search(self, *args, **kwargs)
        finally:
            _SEARCHING.reset(token)

    registry.replace(GROUP, cls, "search", collection_search)


def _wrap_dense(registry: Registry, module: Any, dense: Any) -> None:
    @functools.wraps(dense)
    def search_dense(*args: Any, **kwargs: Any) -> Any:
        coll = _SEARCHING.get()
        if args or coll is None:
            return dense(*args, **kwargs)
        return _dense(coll, kwargs, fallback=lambda: dense(**kwargs))

    registry.replace(GROUP, module, "execute_search_with_index", search_dense)


def _wrap_sparse(registry: Registry, cls: Any, sparse: Any) -> None:
    @functools.wraps(sparse)  # lite_bm25 binds its arguments by this signature
    def search_sparse(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            return sparse(self, *args, **kwargs)
        return _sparse(self, kwargs, fallback=lambda: sparse(self, **kwargs))

    registry.replace(GROUP, cls, "_search_sparse", search_sparse)


def _wrap_warm_up(registry: Registry, cls: Any, index_segments: Any) -> None:
    @functools.wraps(index_segments)
    def index_then_warm(self: Any) -> int:
        built: int = index_segments(self)
        if self._load_state == "loaded":
            try:
                warm(self)
            except Exception:  # a search builds what is missing, as Lite's own code would
                log.exception("index.warm_failed")
        return built

    registry.replace(GROUP, cls, "_ensure_loaded_segments_indexed", index_then_warm)


def _wrap_snapshots(registry: Registry, cls: Any) -> None:
    read_snapshot = registry.original(cls, "_read_snapshot")
    refresh = registry.original(cls, "_refresh_segment_cache")

    @functools.wraps(read_snapshot)
    def snapshot(self: Any) -> Any:
        if _SEARCHING.get() is not self:
            return read_snapshot(self)
        return search_snapshot(self, read_snapshot)

    @functools.wraps(refresh)
    def refresh_and_count(self: Any) -> Any:
        result = refresh(self)  # under the maintenance lock, as every caller holds it
        count = self._memd_refreshes = getattr(self, "_memd_refreshes", 0) + 1
        # The snapshot right after the change, for the searches that come while the
        # compaction this flush schedules holds the lock.
        if hasattr(self, "_maintenance_lock"):  # not yet while the collection opens
            self._memd_last_snapshot = (count, read_snapshot(self))
        return result

    registry.replace(GROUP, cls, "_read_snapshot", snapshot)
    registry.replace(GROUP, cls, "_refresh_segment_cache", refresh_and_count)


def warm(coll: Any) -> None:
    """Compute what the next search needs (visibility, unit vectors, BM25 indexes of new
    segments) in Lite's background worker, which calls this after every flush and
    compaction, rather than in the first search after them (a compacted segment's BM25
    index took 150-400 ms to build inside a search)."""
    from milvus_lite.schema.types import DataType

    snap = generation(coll)
    if snap is None:
        return
    segments, _deltas, gen = snap
    for spec in list(coll._index_specs.values()):
        dtype = next((f.dtype for f in coll._schema.fields if f.name == spec.field_name), None)
        for seg in segments:
            if seg.num_rows == 0:
                continue
            if dtype == DataType.SPARSE_FLOAT_VECTOR and spec.metric_type.upper() == "BM25":
                _sparse_index(coll, seg, spec.field_name, "BM25")
            elif dtype == DataType.FLOAT_VECTOR and spec.metric_type.upper() == "COSINE":
                gen.unit_vectors(seg, spec.field_name)


def _row_mask(gen: Generation, seg: Any, compiled: Any, plan: Any) -> np.ndarray:
    mask = gen.masks[id(seg)]
    if compiled is not None:
        from milvus_lite.search.indexed_filter import evaluate_segment_filter

        mask = mask & evaluate_segment_filter(seg, compiled, plan)
    return mask


# -- dense ---------------------------------------------------------------------------------


def _dense(coll: Any, kw: dict[str, Any], fallback: Callable[[], Any]) -> Any:
    """Lite's execute_search_with_index, with visibility and unit vectors reused."""
    if kw.get("partition_names") or kw["top_k"] <= 0 or kw.get("project_record_fn") is None:
        return fallback()
    snap = generation(coll)
    if snap is None:
        return fallback()
    segments, _deltas, gen = snap
    queries = np.atleast_2d(np.asarray(kw["query_vectors"], dtype=np.float32))
    field_name, top_k, metric = kw["vector_field"], kw["top_k"], kw["metric_type"]
    in_scope = [seg for seg in segments if seg.num_rows > 0]
    found: list[tuple[int, np.ndarray, np.ndarray]] = []
    for source, seg in enumerate(in_scope):
        mask = _row_mask(gen, seg, kw.get("compiled_filter"), kw.get("indexed_filter_plan"))
        _vectors, nulls = seg.vector_data(field_name)
        if nulls is not None:
            mask = mask & nulls
        if not mask.any():
            continue
        ids, dists = _segment_top_k(gen, seg, field_name, metric, queries, top_k, mask, kw)
        found.append((source, ids, dists))
    return [
        _hits(coll, [(d, in_scope[s], row) for d, s, row in _best(found, q, top_k, True)], kw)
        for q in range(len(queries))
    ]


def _segment_top_k(
    gen: Generation,
    seg: Any,
    name: str,
    metric: str,
    queries: np.ndarray,
    top_k: int,
    mask: np.ndarray,
    kw: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    from milvus_lite.index.brute_force import BruteForceIndex

    index = seg.indexes.get(name)
    if metric.upper() != "COSINE" or not (index is None or isinstance(index, BruteForceIndex)):
        if index is None:
            index = BruteForceIndex.build(seg.vector_data(name)[0], metric)
        return index.search(
            queries,
            top_k,
            valid_mask=None if mask.all() else mask,
            params=kw.get("search_params"),
        )
    norms = np.linalg.norm(queries, axis=1, keepdims=True)
    unit_q = queries / np.where(norms == 0, 1.0, norms)
    dists = np.maximum(1.0 - unit_q @ gen.unit_vectors(seg, name).T, 0.0)
    return _top_k(dists, mask, top_k)


def _top_k(dists: np.ndarray, mask: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top_k smallest distances among the masked rows, padded with -1 / inf."""
    nq = dists.shape[0]
    ids = np.full((nq, top_k), -1, dtype=np.int64)
    out = np.full((nq, top_k), np.inf, dtype=np.float32)
    valid = np.flatnonzero(mask)
    k = min(top_k, valid.size)
    for q in range(nq):
        row = dists[q, valid]
        part = np.argpartition(row, k - 1)[:k] if k < valid.size else np.arange(valid.size)
        order = part[np.argsort(row[part], kind="stable")]
        ids[q, :k] = valid[order]
        out[q, :k] = row[order]
    return ids, out


# -- sparse --------------------------------------------------------------------------------


def _sparse(coll: Any, kw: dict[str, Any], fallback: Callable[[], Any]) -> Any:
    """Lite's Collection._search_sparse, with visibility reused."""
    from milvus_lite.index.sparse_factory import _search_prepared_sparse_index

    if kw.get("partition_names") or kw["top_k"] <= 0:
        return fallback()
    snap = generation(coll)
    if snap is None:
        return fallback()
    segments, _deltas, gen = snap
    name, top_k, metric = kw["vector_field"], kw["top_k"], kw["metric_type"]
    queries = coll._prepare_sparse_queries(kw["query_vectors"], name)
    expr = kw.get("expr")
    compiled = coll._compile_filter(expr, timezone=kw.get("timezone")) if expr else None
    plan = coll._indexed_filter_plan(compiled)
    found: list[tuple[int, np.ndarray, np.ndarray]] = []
    for source, seg in enumerate(segments):
        if seg.table is None or len(seg.table) == 0:
            continue
        mask = _row_mask(gen, seg, compiled, plan)
        if not mask.any():
            continue
        index = _sparse_index(coll, seg, name, metric)
        found.append((source, *_search_prepared_sparse_index(index, queries, top_k, mask)))
    return [
        _hits(coll, [(d, segments[s], row) for d, s, row in _best(found, q, top_k, False)], kw)
        for q in range(len(queries))
    ]


def _best(
    found: list[tuple[int, np.ndarray, np.ndarray]], q: int, top_k: int, by_source: bool
) -> list[tuple[float, int, int]]:
    """Query q's best `top_k` (distance, source, row) over every source's own best (its
    `ids` and distances, padded with -1 after the last), smallest distance first; ties
    in the order Lite's merge gives them: by source, then row (`by_source`, the dense
    path, which sorts the tuples), or as found (the sparse path's stable sort). In numpy:
    the tuples of up to 60 hits from each of 7 segments, built and sorted in Python, were
    ~4 % of answering recall's two searches at 10k chunks."""
    if not found:
        return []
    ids = np.concatenate([f[1][q] for f in found])
    dists = np.concatenate([f[2][q] for f in found])
    sources = np.concatenate([np.full(f[1].shape[1], f[0]) for f in found])
    keep = ids >= 0
    ids, dists, sources = ids[keep], dists[keep], sources[keep]
    order = np.lexsort((ids, sources, dists)) if by_source else np.argsort(dists, kind="stable")
    order = order[:top_k]
    picked = dists[order].tolist(), sources[order].tolist(), ids[order].tolist()
    return list(zip(*picked, strict=True))


def _hits(
    coll: Any, picks: list[tuple[float, Any, int]], kw: dict[str, Any]
) -> list[dict[str, Any]]:
    """Lite's hit dicts for (distance, segment, row) picks, in their order.

    Only the columns the projection reads are taken, with one `take` each per segment
    (a table built per segment for one `take` cost more, py-spy round 10): reading
    every column of a hit cell by cell (its 256-float embedding included, as Lite does)
    was most of a search once visibility was cached."""
    import pyarrow as pa
    from milvus_lite.engine.projection import build_projection_plan, project_record

    plan = build_projection_plan(kw.get("output_fields"), coll._schema, api_kind="search")
    records: dict[tuple[int, int], dict[str, Any]] = {}
    by_segment: dict[int, tuple[Any, list[int]]] = {}
    for _dist, seg, row in picks:
        by_segment.setdefault(id(seg), (seg, []))[1].append(row)
    for seg, rows in by_segment.values():
        table = seg.table
        wanted = plan.engine_fields
        columns = [
            c
            for c in table.column_names
            if c not in ("_seq", "_partition")
            and (wanted is None or c in wanted or c == coll._pk_name)
        ]
        at = pa.array(rows, type=pa.int64())  # column by column: no table built per call
        values = [table.column(c).take(at).to_pylist() for c in columns]
        for row, *cells in zip(rows, *values, strict=True):
            records[(id(seg), row)] = dict(zip(columns, cells, strict=True))
    project = _projector(coll._schema, plan, project_record)
    return [
        {"id": seg.pks[row], "distance": dist, "entity": project(records[(id(seg), row)])}
        for dist, seg, row in picks
    ]


def _projector(schema: Any, plan: Any, project_record: Any) -> Callable[[dict[str, Any]], Any]:
    """Lite's `project_record` for a search's hits, bound to one plan: when the plan asks
    for no dynamic field (memd's searches name schema fields only), a hit's entity is its
    requested schema fields but the primary key, in the plan's order, as Lite builds it;
    Lite's function, which looks the schema up again for every field of every hit, was a
    sixth of the index server's time for recall's two searches (py-spy at 10k chunks)."""
    if plan.include_all_dynamic or plan.explicit_dynamic_fields or plan.api_kind != "search":
        return lambda record: project_record(record, schema, plan)
    primary = {f.name for f in schema.fields if f.is_primary}
    names = [n for n in plan.response_schema_fields if n not in primary and n != "$meta"]
    return lambda record: {n: record[n] for n in names if n in record}


def _sparse_index(coll: Any, seg: Any, name: str, metric: str) -> Any:
    """The segment's cached sparse index, built as Lite's search builds it."""
    from milvus_lite.analyzer.sparse import bytes_to_sparse
    from milvus_lite.index.sparse_factory import create_sparse_index, sparse_index_matches

    spec = coll._index_specs.get(name)
    params = spec.build_params if spec else {}
    index = seg.sparse_indexes.get(name)
    if sparse_index_matches(index, metric, params):
        return index
    with BUILDING:  # a search waits for the background warm-up instead of racing it
        index = seg.sparse_indexes.get(name)
        if not sparse_index_matches(index, metric, params):
            rows = seg.table.column(name).to_pylist()
            index = create_sparse_index(metric, params)
            index.build([bytes_to_sparse(r) if isinstance(r, bytes) else (r or {}) for r in rows])
            seg.sparse_indexes[name] = index
    return index


# -- cosines of given rows -----------------------------------------------------------------


def cosines(coll: Any, field: str, vector: Any, keys: list[Any]) -> dict[Any, float] | None:
    """The cosine similarity of `vector` to the stored `field` vector of each visible row
    whose primary key is in `keys`, as a dense search over `field` reports it; None when
    Lite's own code must decide what is visible (rows in the memtable: `generation`).

    Recall's fusion needs the cosine of every BM25 hit the dense half did not return.
    Each such hit's 384-float embedding used to travel to memd, which computed it in
    Python: converting those embeddings to lists, packing, decoding and the Python
    cosine were a fifth of memd's CPU time in a recall at 10k chunks (py-spy;
    docs/performance.md, "Recall latency, round 9", has what that was worth). The unit
    vectors are the generation's, cached for the dense half."""
    token = _SEARCHING.set(coll)  # a snapshot as a search takes it (lite_visibility)
    try:
        snap = generation(coll)
    finally:
        _SEARCHING.reset(token)
    if snap is None:
        return None
    segments, _deltas, gen = snap
    query = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(query))
    unit_q = query / norm if norm else query
    found: dict[Any, float] = {}
    for seg in segments:
        mask = gen.masks.get(id(seg))
        if mask is None or seg.num_rows == 0:
            continue
        picks = [(k, r) for k in keys if (r := seg.pk_to_row.get(k)) is not None and mask[r]]
        if not picks:
            continue
        rows = gen.unit_vectors(seg, field)[[r for _, r in picks]]
        dists = np.maximum(1.0 - rows @ unit_q, 0.0)  # as `_segment_top_k`, then Lite's 1 - d
        found.update((key, 1.0 - float(d)) for (key, _), d in zip(picks, dists, strict=True))
    return found
