"""In-process hybrid search and expand against one client's index, for recall.

Recall reaches the index through `index_client`: JSON lines to the index server's second
socket (so memd never imports pymilvus), or pymilvus for a Milvus server; the connection
is kept. The query is embedded with the model the watcher indexes with (the embedder
child for a bundled model), on a pool thread while the BM25 half is already asked.

The search asks the index for its two halves over the same filter, as memsearch's
`MilvusStore.search` does (memsearch 0.4.23), but fuses them in memd: a dense COSINE request
and a BM25 request (`halves`), each for the best `CANDIDATES` chunks, fused and given a
calibrated relevance by `ranking.fused_rows` (memsearch's equal-weight RRF lets the weaker
half drag the stronger one down). Every RPC carries a deadline. Expand (`expand`) is memsearch's
section rule: the full markdown section a chunk belongs to. The query
embedding is `query_embedding`, time filters `time_filter`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from memd.config import EmbeddingConfig
from memd.indexing import embedding
from memd.indexing.query import ranking
from memd.indexing.query.embedder_client import EmbedderClient
from memd.indexing.query.halves import (
    OUTPUT_FIELDS,  # noqa: F401 - tests and bench import it from here
    IndexUnavailableError,
    halves,
    halves_while_embedding,
    remaining,
    vector_of,
)
from memd.indexing.query.index_client import (
    IndexClient,
    IndexRequestError,
    IndexTransportError,
    connect,
)
from memd.indexing.query.query_embedding import QueryEmbedder
from memd.indexing.query.time_filter import exchange_time, in_range, time_filter_expr
from memd.indexing.targets import IndexTarget, effective_model

log = structlog.get_logger()

CANDIDATES = 60  # from each half, before fusion (20 -> 60: docs/quality.md round 7)
DEFAULT_TIMEOUT = 10.0
READY_SECONDS = 5.0  # how long a collection found ready is taken to stay so
QUERY_VECTORS = 16  # the latest queries' embeddings kept, per client (IndexSearcher._vector)
# Query embeddings in flight (`IndexSearcher._pending_vector`), for every client: each
# thread waits on the embedder child (or a remote provider); made on first use, idle after.
_EMBEDDING = ThreadPoolExecutor(max_workers=8, thread_name_prefix="memd-query-vector")


class InFlight:
    """How many searches memd runs now, every client's: `_pending_vector` overlaps the
    embedding with the BM25 half only for a search that runs alone.

    Under bench/load.py (20 clients, 2 cores, 600 s) overlapping every search made
    recall slower (p50 2.1 -> 2.6 s, 15 % fewer recalls answered) and records too: the
    cores were busy with other recalls already, and the second round trip waits once
    more for the GIL in memd and in the index server (docs/performance.md, "Recall
    latency, round 10")."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def entered(self) -> Iterator[bool]:
        """Count a search for as long as it runs; yields whether it is the only one."""
        with self._lock:
            self._count += 1
            alone = self._count == 1
        try:
            yield alone
        finally:
            with self._lock:
                self._count -= 1


_SEARCHES = InFlight()


@dataclass(frozen=True)
class Hit:
    """One chunk found by a search. `when` is the exchange time from its heading, if any."""

    chunk_hash: str
    source: str
    heading: str
    heading_level: int
    content: str
    score: float
    start_line: int
    end_line: int
    when: datetime | None = None
    features: tuple[float, ...] = ()  # what the relevance is computed from (ranking.FEATURES)


# -- the searcher -----------------------------------------------------------------------------


class IndexSearcher:
    """Search and expand for one client; keep one per client and `close()` it when done.

    Thread-safe; calls are blocking (run them in a worker thread from async code). Each
    call is bounded by `timeout` seconds overall; a dead or slow index raises
    IndexUnavailableError and the connection is dropped, so the next call reconnects.
    """

    def __init__(
        self,
        target: IndexTarget,
        embedding_cfg: EmbeddingConfig,
        root: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        bm25_weight: float = ranking.DEFAULT_BM25_WEIGHT,
        embedder: embedding.Embedder | EmbedderClient | None = None,  # None: in-process
    ) -> None:
        self.target = target
        self.root = root
        self.timeout = timeout
        self.bm25_weight = bm25_weight
        self._embedder = QueryEmbedder(embedding_cfg, embedder)
        self._tuned = ranking.tuning(effective_model(embedding_cfg))
        self._client: IndexClient | None = None
        self._lock = threading.Lock()
        self._ready_until = 0.0  # monotonic time until which the collection is known ready
        # query -> embedding, as doubles: a list of 384 Python floats takes 12.3 KB, the
        # array 3 KB (64 per client, 15.7 MB at 20 clients before; issue 29)
        self._vectors: OrderedDict[str, array[float]] = OrderedDict()

    # -- public API --

    def search(
        self,
        query: str,
        top_k: int = 5,
        *,
        after: datetime | None = None,
        before: datetime | None = None,
        timeout: float | None = None,
        bm25_weight: float | None = None,
    ) -> list[Hit]:
        """The top chunks for `query`, best first; [] when nothing is indexed yet.

        Each hit's `score` is its calibrated relevance (memd.indexing.query.ranking)."""
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        if not query.strip():
            return []
        deadline = time.monotonic() + (timeout or self.timeout)
        timed = after is not None or before is not None
        expr = time_filter_expr(after, before)
        fetch = top_k * 2 if timed else top_k
        weight = self.bm25_weight if bm25_weight is None else bm25_weight
        with _SEARCHES.entered() as alone:
            vector = self._pending_vector(query, deadline, overlap=alone)
            rows = self._call(
                lambda c: self._hybrid(c, vector, query, fetch, expr, deadline, weight)
            )
        hits = [_hit(row) for row in rows]
        return [h for h in hits if in_range(h.when, after, before)][:top_k]

    def _pending_vector(self, query: str, deadline: float, *, overlap: bool) -> Future[list[float]]:
        """The query's embedding: done when it is one of the last kept or not to
        `overlap` (computed here first), else computed on `_EMBEDDING`'s threads while
        the lane sends the BM25 half (`_fused`): embedding a question took about a fifth
        of a recall's wall time at 10k chunks, waiting for the embedder child, and the
        BM25 half does not need it."""
        done: Future[list[float]] = Future()
        with self._lock:
            kept = self._vectors.get(query)
            if kept is not None:
                self._vectors.move_to_end(query)
                done.set_result(kept.tolist())
                return done
        if overlap:
            return _EMBEDDING.submit(self._vector, query, deadline)
        done.set_result(self._vector(query, deadline))
        return done

    def _vector(self, query: str, deadline: float) -> list[float]:
        """The query's embedding; the last QUERY_VECTORS queries' are kept. An LLM asks
        again what it asked a moment ago (a retry, the same question in a new turn), and
        a vector is the same every time (the model runs each text on its own), so only
        the model's few ms are saved: no result changes. 16, not 64: at 3 KB a vector,
        64 a client came to 4 MB of memd at 20 clients, for repeats a moment apart."""
        with self._lock:
            kept = self._vectors.get(query)
            if kept is not None:
                self._vectors.move_to_end(query)
                return kept.tolist()
        try:
            vector = self._embedder.vector(query, remaining(deadline))  # []: keywords only
        except TimeoutError:
            raise IndexUnavailableError("embedding the query timed out") from None
        with self._lock:
            if vector:
                self._vectors[query] = array("d", vector)
            while len(self._vectors) > QUERY_VECTORS:
                self._vectors.popitem(last=False)
        return vector

    def headings(self, sources: list[str], timeout: float | None = None) -> list[tuple[str, str]]:
        """(source, heading) of every row of the given source files (for memory.forget)."""
        if not sources:
            return []
        deadline = time.monotonic() + (timeout or self.timeout)
        expr = f"source in {json.dumps(sources)}"

        def run(client: IndexClient) -> list[tuple[str, str]]:
            if not client.has_collection(self.target.collection, timeout=remaining(deadline)):
                return []
            rows = client.query(
                self.target.collection,
                filter=expr,
                output_fields=["source", "heading"],
                limit=16_384,
                timeout=remaining(deadline),
            )
            return [(r["source"], r["heading"]) for r in rows]

        return self._call(run)

    def count(self, timeout: float | None = None) -> int:
        """Rows in the client's collection (0 when it does not exist yet)."""
        deadline = time.monotonic() + (timeout or self.timeout)

        def run(client: IndexClient) -> int:
            if not client.has_collection(self.target.collection, timeout=remaining(deadline)):
                return 0
            return _row_count(client, self.target.collection, deadline)

        return self._call(run)

    def close(self) -> None:
        with self._lock:
            self._drop_client()
        self._embedder.close()

    # -- internals --

    def _call(self, fn: Callable[[IndexClient], Any]) -> Any:
        """Run fn with a connected client, mapping every failure of the index to
        IndexUnavailableError (and dropping the client, whose connection may be dead)."""
        try:
            client = self._connect()
            return fn(client)
        except IndexUnavailableError:
            raise
        except (IndexRequestError, IndexTransportError, ConnectionError, TimeoutError) as exc:
            with self._lock:
                self._drop_client()
            raise IndexUnavailableError(f"index {self.target.uri}: {exc}") from exc

    def _connect(self) -> IndexClient:
        with self._lock:
            if self._client is None:
                self._client = connect(self.target, self.timeout)
            return self._client

    def _drop_client(self) -> None:
        self._ready_until = 0.0
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def _hybrid(
        self,
        client: IndexClient,
        vector: Future[list[float]],
        query: str,
        limit: int,
        expr: str,
        deadline: float,
        bm25_weight: float,
    ) -> list[dict[str, Any]]:
        """Both halves, fused in memd (memd.indexing.query.ranking); `score` is the relevance.

        Whether the collection exists, is loaded and holds rows is checked at most every
        READY_SECONDS (three round trips, ~10 ms of a recall under load); a search that
        fails in between is checked again at once, so a dropped or emptied collection
        still answers nothing rather than an error."""
        args = (client, vector, query, limit, expr, deadline, bm25_weight)
        if time.monotonic() < self._ready_until:
            try:
                return self._fused(*args)
            except IndexRequestError:
                self._ready_until = 0.0
        name = self.target.collection
        if not client.has_collection(name, timeout=remaining(deadline)):
            return []
        self._ensure_loaded(client, deadline)
        # BM25 over an empty collection fails (avgdl = 0); memsearch checks the same way.
        if _row_count(client, name, deadline) == 0:
            return []
        self._ready_until = time.monotonic() + READY_SECONDS
        return self._fused(*args)

    def _fused(
        self,
        client: IndexClient,
        vector: Future[list[float]],
        query: str,
        limit: int,
        expr: str,
        deadline: float,
        bm25_weight: float,
    ) -> list[dict[str, Any]]:
        """Both halves in one round trip when the query's vector is at hand; else the
        BM25 half first, while it is being embedded (`halves_while_embedding`)."""
        pool, w, name = max(limit, CANDIDATES), bm25_weight, self.target.collection
        if vector.done():
            known = vector_of(vector, deadline)
            dense, keyword = halves(client, name, known, query, pool, expr, deadline)
        else:
            dense, keyword, known = halves_while_embedding(
                client, name, vector, query, pool, expr, deadline
            )
        tuned = self._tuned if known else ranking.KEYWORDS_ONLY
        return ranking.fused_rows(dense, keyword, query, limit, w, tuned=tuned)

    def _ensure_loaded(self, client: IndexClient, deadline: float) -> None:
        """A restarted Milvus Lite opens indexed collections released; search needs them loaded."""
        state = client.get_load_state(self.target.collection, timeout=remaining(deadline))
        if str(state.get("state", "")).endswith("Loaded"):
            return
        client.load_collection(self.target.collection, timeout=remaining(deadline))


def _row_count(client: IndexClient, name: str, deadline: float) -> int:
    stats = client.get_collection_stats(name, timeout=remaining(deadline))
    if int(stats.get("row_count", 0)) > 0:
        return int(stats["row_count"])
    rows = client.query(
        name, filter="", output_fields=["count(*)"], limit=None, timeout=remaining(deadline)
    )
    return int(rows[0]["count(*)"]) if rows else 0


def _hit(row: dict[str, Any]) -> Hit:
    heading = row.get("heading") or ""
    return Hit(
        chunk_hash=row["chunk_hash"],
        source=row["source"],
        heading=heading,
        heading_level=int(row.get("heading_level") or 0),
        content=row.get("content") or "",
        score=float(row["score"]),
        start_line=int(row.get("start_line") or 0),
        end_line=int(row.get("end_line") or 0),
        when=exchange_time(heading),
        features=tuple(row.get("features") or ()),
    )


# -- expand -----------------------------------------------------------------------------------
