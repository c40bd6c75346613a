"""Record latency (p50/p99) and throughput with 8 concurrent socket clients.

    .venv/bin/python bench/record.py [--clients 8] [--per-client 500]

Each client is its own process with its own connection and sends one request at a time,
so latency is the full round trip: JSON-RPC, transcript append, fsync, state commit.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path

from _daemon import percentile, running_daemon

from memd.cli.client import MemdClient


def worker(sock: str, k: int, n: int, start: mp.Event, out: mp.Queue) -> None:
    with MemdClient(Path(sock), timeout=60) as client:
        start.wait()
        lat = []
        for i in range(n):
            t0 = time.perf_counter()
            client.call(
                "memory.record_exchange",
                {
                    "client_id": "bench",
                    "conversation_id": f"conv-{k}",
                    "user": f"question {i} from client {k}: " + "lorem ipsum " * 20,
                    "assistant": f"answer {i}: " + "dolor sit amet " * 40,
                },
            )
            lat.append(time.perf_counter() - t0)
        out.put(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=500)
    args = ap.parse_args()
    clients = {"bench": {"memory_enabled": True, "mode": "mcp_via_llm"}}
    with running_daemon(clients=clients) as memd:
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=worker, args=(str(memd.socket), k, args.per_client, start, out))
            for k in range(args.clients)
        ]
        for p in procs:
            p.start()
        time.sleep(1.0)
        t0 = time.perf_counter()
        start.set()
        lat = [x for _ in procs for x in out.get()]
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join()
    n = len(lat)
    print(f"record_exchange: {n} exchanges, {args.clients} concurrent clients")
    print(f"  throughput  {n / elapsed:8.0f} exchanges/s")
    print(f"  p50         {percentile(lat, 50) * 1000:8.2f} ms")
    print(f"  p99         {percentile(lat, 99) * 1000:8.2f} ms")
    print(f"  max         {max(lat) * 1000:8.2f} ms")


if __name__ == "__main__":
    main()
