"""Per-call latency of memd's embedder child, as a watcher and as recall see it.

A watcher embeds each event's chunks through memsearch's `memd` provider
(memd.indexing.engine.embedder_provider) on the embedder child's Unix socket; recall embeds
its query through an `EmbedderClient` on the same socket. Both are timed here against a
real `python -m memd.indexing.children.embedder`, started for the run. The HTTP endpoint the
watchers used before (and its numbers) is in docs/indexing.md's history.

    .venv/bin/python bench/embed_latency.py [--calls 200] \
        [--model wordllama-l2-256]          # default: the default model, MiniLM
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from memd.indexing import embedding
from memd.indexing.engine import embedder_provider
from memd.indexing.query.embedder_client import EmbedderClient
from tests.support.embedder import EmbedderChild


def measure(socket: Path, calls: int, texts: list[str], model: str) -> list[float]:
    """What a watcher's event costs: one `embed` of memsearch's `memd` provider."""
    provider = embedder_provider.provider(model, socket=str(socket))
    asyncio.run(provider.embed(texts))
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        asyncio.run(provider.embed(texts))
        out.append((time.perf_counter() - t) * 1000)
    return sorted(out)


def query(socket: Path, calls: int, model: str) -> None:
    """A recall query's embedding through the child: wall time, and memd's own CPU."""
    client = EmbedderClient(socket)
    wall, cpu = [], []
    try:
        client.embed_one("warm up", model)
        for i in range(calls):
            text = f"what can't I eat at dinner number {i}?"
            t, c = time.perf_counter(), time.process_time()
            client.embed_one(text, model)
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((time.process_time() - c) * 1000)
    finally:
        client.close()
    wall.sort()
    print(
        f"{model}: query  via child   p50 {statistics.median(wall):6.2f} ms  "
        f"p99 {wall[int(len(wall) * 0.99)]:6.2f} ms  memd CPU p50 {statistics.median(cpu):6.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--model", default=embedding.MODEL_NAME, choices=list(embedding.MODELS))
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    one = [
        "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** which port?\n\n**Assistant:** 6543."
    ]
    with EmbedderChild(args.model) as child:
        query(child.socket, args.calls, args.model)
        for label, texts in (("1 text", one), ("64 texts", one * 64)):
            lat = measure(child.socket, args.calls, texts, args.model)
            print(
                f"{label:9s} watcher     p50 {statistics.median(lat):6.2f} ms  "
                f"p99 {lat[int(len(lat) * 0.99)]:6.2f} ms"
            )


if __name__ == "__main__":
    main()
