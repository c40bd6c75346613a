"""Per-call latency of memd's embedding endpoint, as a watcher sees it.

What memsearch's openai provider does per watcher event: one POST /v1/embeddings on a
fresh connection (memd answers `Connection: close`, see memd/indexing/embed_server.py),
through the openai SDK. The endpoint runs on aiohttp since the proxy brought it in; its
predecessor on `http.server` measured, in the same run on the same machine, is in
docs/indexing.md.

    .venv/bin/python bench/embed_latency.py [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

from memd.indexing import embedding
from memd.indexing.embed_server import EmbeddingServer

EMBEDDER = embedding.Embedder()  # one model for the whole run


def measure(calls: int, texts: list[str]) -> list[float]:
    with EmbeddingServer(EMBEDDER.embed) as srv:
        ep = srv.endpoint
        client = openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        client.embeddings.create(input=texts, model=ep.model, encoding_format="float")
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            client.embeddings.create(input=texts, model=ep.model, encoding_format="float")
            out.append((time.perf_counter() - t) * 1000)
        return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    EMBEDDER.model()
    one = [
        "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** which port?\n\n**Assistant:** 6543."
    ]
    for label, texts in (("1 text", one), ("64 texts", one * 64)):
        lat = measure(args.calls, texts)
        print(
            f"{label:9s} close       p50 {statistics.median(lat):6.2f} ms  "
            f"p99 {lat[int(len(lat) * 0.99)]:6.2f} ms"
        )


if __name__ == "__main__":
    main()
