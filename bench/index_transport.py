"""Recall's index requests two ways, against one index server: JSON socket vs pymilvus/gRPC.

memd reaches a local index over the index server's JSON socket (memd.indexing.query.index_client,
issue 16 item 3); before, it used pymilvus over the gRPC socket, which the index server
still serves (the watchers use it). Both run the same engine call. This writes
memsearch-shaped chunks with real vectors (bench/search_speed.py's), lets the server
settle, and then times `IndexSearcher.search` (embedding, both halves, fusion) and the
bare two halves through each transport, alternating query by query so a busy machine
weighs on both alike.

    .venv/bin/python bench/index_transport.py [--rows 10000] [--queries 200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from search_speed import BATCH, COLLECTION, QUERIES, chunks, memd_server, summary, write

from memd.config import EmbeddingConfig
from memd.indexing.index_requests import query_socket_path
from memd.indexing.query import search
from memd.indexing.query.index_client import IndexClient, LiteIndexClient
from memd.indexing.query.pymilvus_client import PymilvusIndexClient
from memd.indexing.query.search import IndexSearcher
from memd.indexing.targets import IndexTarget


class _Searcher(IndexSearcher):
    """An IndexSearcher on a given transport."""

    def __init__(self, target: IndexTarget, client: IndexClient) -> None:
        super().__init__(target, EmbeddingConfig(), timeout=120)
        self._fixed = client

    def _connect(self) -> IndexClient:
        return self._fixed


def fill(uri: str, rows: int) -> None:
    from memsearch.store import MilvusStore

    store = MilvusStore(uri, collection=COLLECTION, dimension=256, _create_if_missing=True)
    batch: list[dict] = []
    for row in chunks(rows):
        batch.append(row)
        if len(batch) == BATCH:
            write(store, batch)
            batch = []
    if batch:
        write(store, batch)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--settle", type=float, default=10.0)
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="memd-t-") as tmp, memd_server(Path(tmp)) as uri:
        fill(uri, args.rows)
        time.sleep(args.settle)
        target = IndexTarget(uri, COLLECTION)
        ways = {
            "JSON socket": LiteIndexClient(query_socket_path(Path(uri.removeprefix("unix:")))),
            "pymilvus/gRPC": PymilvusIndexClient(target, 120.0),
        }
        searchers = {name: _Searcher(target, client) for name, client in ways.items()}
        vectors = [searchers["JSON socket"]._embedder.embed(q, 60.0) for q in QUERIES]
        recall: dict[str, list[float]] = {name: [] for name in ways}
        halves: dict[str, list[float]] = {name: [] for name in ways}
        for s in searchers.values():  # warm both (load state, BM25 scorer)
            s.search(QUERIES[0])
        for i in range(args.queries):
            order = list(ways) if i % 2 == 0 else list(reversed(ways))
            for name in order:
                q = QUERIES[i % len(QUERIES)]
                t = time.perf_counter()
                assert searchers[name].search(q, top_k=5)
                recall[name].append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                vec = vectors[i % len(QUERIES)]
                search.halves(ways[name], COLLECTION, vec, q, 20, "", time.monotonic() + 60)
                halves[name].append((time.perf_counter() - t) * 1000)
        for s in searchers.values():
            s.close()
    print(f"{args.rows} chunks, {args.queries} queries each way, alternating")
    for name in ways:
        print(f"  {name:<14} search {summary(recall[name])}")
        print(f"  {name:<14} halves {summary(halves[name])}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
