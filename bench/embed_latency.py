"""Per-call latency of memd's embedding endpoint: TCP_NODELAY on/off, keep-alive or not.

What memsearch's openai provider does per watcher event: one POST /v1/embeddings. memd
answers `Connection: close` (see memd/embed_server.py); keep-alive rows are for comparison.

    .venv/bin/python bench/embed_latency.py [--calls 200]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

import openai

from memd.indexing import embed_server, embedding
from memd.indexing.embed_server import EmbeddingServer


def handler(nodelay: bool, keepalive: bool) -> type:
    class Variant(embed_server._Handler):
        protocol_version = "HTTP/1.1" if keepalive else "HTTP/1.0"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))

        def _send(self, status, body):  # type: ignore[no-untyped-def]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if not keepalive:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return Variant


def measure(calls: int, nodelay: bool, keepalive: bool, texts: list[str]) -> list[float]:
    srv = EmbeddingServer()
    original = embed_server._Server.__init__

    def init(self, addr, api_key, model, embedder):  # type: ignore[no-untyped-def]
        original(self, addr, api_key, model, embedder)
        self.RequestHandlerClass = handler(nodelay, keepalive)

    embed_server._Server.__init__ = init  # type: ignore[method-assign]
    try:
        ep = srv.start()
    finally:
        embed_server._Server.__init__ = original  # type: ignore[method-assign]
    client = openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
    try:
        client.embeddings.create(input=texts, model=ep.model, encoding_format="float")
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            client.embeddings.create(input=texts, model=ep.model, encoding_format="float")
            out.append((time.perf_counter() - t) * 1000)
        return sorted(out)
    finally:
        srv.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    embedding.model()
    one = [
        "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** which port?\n\n**Assistant:** 6543."
    ]
    batch = one * 64
    for label, texts in (("1 text", one), ("64 texts", batch)):
        for keepalive in (False, True):
            for nodelay in (True, False):
                lat = measure(args.calls, nodelay, keepalive, texts)
                conn = "keep-alive" if keepalive else "close     "
                print(
                    f"{label:9s} {conn} TCP_NODELAY={'on ' if nodelay else 'off'}  "
                    f"p50 {statistics.median(lat):6.2f} ms  "
                    f"p99 {lat[int(len(lat) * 0.99)]:6.2f} ms"
                )


if __name__ == "__main__":
    main()
