"""Hybrid search latency right after a burst of writes, at ~10k chunks.

Compares memd's index server (flush after every write, Unix socket) with a stock Milvus
Lite gRPC server (rows stay in the memtable until 128 MB, TCP loopback). Both get the same
10k memsearch-shaped chunks with real vectors of the default model, written in batches of 64 as a
watcher does; the searches start the moment the last write returns.

    .venv/bin/python bench/search_speed.py [--rows 10000] [--queries 50]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memd.config import EmbeddingConfig
from memd.indexing import embedding
from memd.indexing.children import index_ready
from memd.indexing.query.search import IndexSearcher
from memd.indexing.targets import IndexTarget

EMBEDDER = embedding.Embedder()  # one model for the whole run

COLLECTION = "memd_bench"
BATCH = 64
QUERIES = [
    "staging database port",
    "how to rotate certificates",
    "deploy rollback plan",
    "who owns the billing service",
    "python dependency upgrade",
    "memory leak in worker",
    "weekly meeting notes",
    "vacation schedule",
    "api rate limit errors",
    "kubernetes node upgrade",
]


def words(rng: random.Random, n: int = 4000) -> list[str]:
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "an", "el", "or", "ip"]
    common = [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "for",
        "on",
        "with",
        "that",
        "this",
        "it",
        "deploy",
        "database",
        "port",
        "service",
        "error",
        "config",
        "user",
        "release",
        "test",
        "memory",
        "search",
        "index",
        "query",
        "cache",
        "server",
        "client",
        "billing",
        "certificate",
        "kubernetes",
        "python",
        "rollback",
        "meeting",
        "notes",
        "api",
    ]
    made = {"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(n)}
    return common * 20 + sorted(made)


def chunks(count: int, seed: int = 7) -> Iterator[dict]:
    rng = random.Random(seed)
    vocab = words(rng)
    for i in range(count):
        when = f"2026-{1 + i // 3000 % 12:02d}-{1 + i % 28:02d} {i % 24:02d}:{i % 60:02d}:00 UTC"
        heading = f"{when} · exchange {i % 50 + 1}"
        user = " ".join(rng.choice(vocab) for _ in range(rng.randint(8, 30)))
        answer = " ".join(rng.choice(vocab) for _ in range(rng.randint(40, 160)))
        content = f"## {heading}\n\n**User:** {user}\n\n**Assistant:** {answer}"
        yield {
            "chunk_hash": f"{i:016x}",
            "content": content,
            "heading": heading,
            "source": f"/bench/sessions/s{i // 100:04d}.md",
            "heading_level": 2,
            "start_line": 1 + (i % 100) * 6,
            "end_line": 6 + (i % 100) * 6,
        }


def wait_port(port: int) -> None:
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)


@contextlib.contextmanager
def memd_server(tmp: Path) -> Iterator[str]:
    sock = tmp / "index.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memd.indexing.children.index_server",
            "--data-dir",
            str(tmp / "memd-data"),
            "--socket",
            str(sock),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not index_ready(sock):
            time.sleep(0.05)
        yield f"unix:{sock}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


@contextlib.contextmanager
def stock_server(tmp: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "milvus_lite",
            "server",
            "--data-dir",
            str(tmp / "stock-data"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def run(uri: str, rows: int, queries: int, pause: float, steady: int) -> dict[str, Any]:
    """Phase 1: the burst, then `queries` searches. Phase 2: `steady` rounds of one new
    exchange, a 1 s pause (the watcher's debounce is 0.3 s), one search."""
    from memsearch.store import MilvusStore

    store = MilvusStore(
        uri, collection=COLLECTION, dimension=embedding.DIMENSION, _create_if_missing=True
    )
    source = chunks(rows + steady)
    write_time = 0.0
    batch: list[dict] = []
    for _ in range(rows):
        batch.append(next(source))
        if len(batch) == BATCH:
            write_time += write(store, batch)
            batch = []
    if batch:
        write_time += write(store, batch)
    time.sleep(pause)
    searcher = IndexSearcher(IndexTarget(uri, COLLECTION), EmbeddingConfig(), timeout=120)
    burst = [timed_search(searcher, i) for i in range(queries)]
    after_write = []
    for i in range(steady):
        write(store, [next(source)])
        time.sleep(1.0)
        after_write.append(timed_search(searcher, i))
    searcher.close()
    store.close()
    return {"write_s": write_time, "burst": burst, "steady": after_write}


def timed_search(searcher: IndexSearcher, i: int) -> float:
    t = time.perf_counter()
    hits = searcher.search(QUERIES[i % len(QUERIES)], top_k=5)
    assert hits
    return (time.perf_counter() - t) * 1000


def summary(latencies: list[float]) -> str:
    if not latencies:
        return "-"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"p50 {statistics.median(ordered):7.1f} ms  p99 {p99:7.1f} ms  first {latencies[0]:7.1f} ms"
    )


def write(store, batch: list[dict]) -> float:
    vectors = EMBEDDER.embed([r["content"] for r in batch])
    t = time.perf_counter()
    store.upsert([{**r, "embedding": v} for r, v in zip(batch, vectors, strict=True)])
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--only", choices=["memd", "stock"], default=None)
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds between the last write and the first search",
    )
    parser.add_argument(
        "--steady", type=int, default=10, help="rounds of: write one exchange, wait 1 s, search"
    )
    args = parser.parse_args()
    EMBEDDER.model()
    print(
        f"{args.rows} chunks, batches of {BATCH}, {args.queries} hybrid searches (top 5) "
        f"right after the burst; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    servers = {
        "memd index server (flush after every write)": memd_server,
        "stock Milvus Lite server (rows stay in the memtable)": stock_server,
    }
    for label, server in servers.items():
        if args.only and not label.startswith(args.only):
            continue
        with tempfile.TemporaryDirectory(prefix="memd-bench-") as tmp, server(Path(tmp)) as uri:
            r = run(uri, args.rows, args.queries, args.pause, args.steady)
        print(
            f"{label}\n  burst writes {r['write_s']:.1f} s\n"
            f"  search right after the burst:      {summary(r['burst'])}\n"
            f"  search 1 s after one new exchange: {summary(r['steady'])}"
        )


if __name__ == "__main__":
    main()
