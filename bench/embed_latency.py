"""Per-call latency of memd's embedding endpoint, as a watcher sees it.

What memsearch's openai provider does per watcher event: one POST /v1/embeddings on a
fresh connection (memd answers `Connection: close`, see memd/indexing/daemon/embed_server.py),
through the openai SDK. The endpoint runs on aiohttp since the proxy brought it in; its
predecessor on `http.server` measured, in the same run on the same machine, is in
docs/indexing.md.

    .venv/bin/python bench/embed_latency.py [--calls 200] \
        [--model wordllama-l2-256]          # default: the default model, MiniLM

It also times what recall does per query in memd's process: one short question embedded
(`Embedder.embed_one`), wall and CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

from memd.indexing import embedding
from memd.indexing.daemon.embed_server import EmbeddingServer

EMBEDDER = embedding.Embedder()  # one model for the whole run


def measure(calls: int, texts: list[str], model: str) -> list[float]:
    with EmbeddingServer(EMBEDDER, model=model) as srv:
        ep = srv.endpoint
        client = openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        client.embeddings.create(input=texts, model=ep.model, encoding_format="float")
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            client.embeddings.create(input=texts, model=ep.model, encoding_format="float")
            out.append((time.perf_counter() - t) * 1000)
        return sorted(out)


def query(calls: int, model: str) -> None:
    """A recall query's embedding, in process: wall and CPU per call."""
    wall, cpu = [], []
    for i in range(calls):
        text = f"what can't I eat at dinner number {i}?"
        t, c = time.perf_counter(), time.process_time()
        EMBEDDER.embed_one(text, model)
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    wall.sort()
    print(
        f"{model}: query  in process  p50 {statistics.median(wall):6.2f} ms  "
        f"p99 {wall[int(len(wall) * 0.99)]:6.2f} ms  CPU p50 {statistics.median(cpu):6.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--model", default=embedding.MODEL_NAME, choices=list(embedding.MODELS))
    args = parser.parse_args()
    EMBEDDER.model(args.model)
    query(args.calls, args.model)
    one = [
        "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** which port?\n\n**Assistant:** 6543."
    ]
    for label, texts in (("1 text", one), ("64 texts", one * 64)):
        lat = measure(args.calls, texts, args.model)
        print(
            f"{label:9s} close       p50 {statistics.median(lat):6.2f} ms  "
            f"p99 {lat[int(len(lat) * 0.99)]:6.2f} ms"
        )


if __name__ == "__main__":
    main()
