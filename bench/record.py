"""Record latency (p50/p99) and throughput, secret scrubbing on and off, in one run.

    .venv/bin/python bench/record.py [--clients 8] [--per-client 300] [--lib 400]

1. Through the socket: a daemon with `[privacy] redact_secrets = false`, then one with
   `true`, each with `--clients` concurrent clients (one process and connection each, one
   request at a time): the full round trip (JSON-RPC, scrub, append, fsync, state commit).
2. The record path alone (memd.sessions, no socket, one client): a ~2 KB exchange with
   scrubbing off and on, interleaved call by call so drift hits both alike.
3. The scrubber alone (CPU time of the calling thread): a 2 KB exchange, a 1 MiB paste
   of prose and code, a 1 MiB base64 blob; and a WAL checkpoint(TRUNCATE) (wall time),
   what a commit that removed text pays.

Prints figures only; the goal (issue #26) is <= 0.3 ms p50 added for a 2 KB exchange and
<= 50 ms for a 1 MiB paste.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing as mp
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _daemon import percentile, running_daemon

from memd.cli.client import MemdClient
from memd.layout import ClientLayout
from memd.redaction import Scrubber, truncate_wal
from memd.sessions.tracker import ClientSessions

USER = "How do I set the retry policy for the uploader? " * 20  # ~1 KB each side
REPLY = "Set `retries = 3` in the [upload] table and restart; backoff doubles. " * 14
KEY = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"


def worker(sock: str, k: int, n: int, start: mp.Event, out: mp.Queue) -> None:
    with MemdClient(Path(sock), timeout=60) as client:
        start.wait()
        lat = []
        for i in range(n):
            user = f"q{i} c{k} " + USER + (f" my key {KEY}" if i % 10 == 0 else "")
            t0 = time.perf_counter()
            client.call(
                "memory.record_exchange",
                {
                    "client_id": "bench",
                    "conversation_id": f"c{k}",
                    "user": user,
                    "assistant": REPLY,
                },
            )
            lat.append(time.perf_counter() - t0)
        out.put(lat)


def socket_run(redact: bool, clients: int, per_client: int) -> None:
    config = {
        "clients": {"bench": {"memory_enabled": True, "mode": "mcp_via_llm"}},
        "privacy": {"redact_secrets": redact},
    }
    with running_daemon(**config) as memd:
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        args = (str(memd.socket),)
        procs = [
            ctx.Process(target=worker, args=(*args, k, per_client, start, out))
            for k in range(clients)
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
    _line(f"socket, {clients} clients, scrub {'on ' if redact else 'off'}", lat, elapsed)


def _line(what: str, lat: list[float], elapsed: float | None = None) -> None:
    rate = f"  {len(lat) / elapsed:7.0f}/s" if elapsed else ""
    print(
        f"  {what:<34} n={len(lat):>5}  p50 {percentile(lat, 50) * 1000:8.3f} ms"
        f"  p99 {percentile(lat, 99) * 1000:8.3f} ms{rate}"
    )


async def lib_run(n: int) -> None:
    """The record path in-process, scrubbing off and on interleaved (two clients)."""
    with tempfile.TemporaryDirectory(prefix="memd-bench-") as tmp:
        on, off = Scrubber(), Scrubber(enabled=False)
        lat: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        async with (
            ClientSessions(ClientLayout(Path(tmp), "on"), scrubber=on) as a,
            ClientSessions(ClientLayout(Path(tmp), "off"), scrubber=off) as b,
        ):
            t_all = time.perf_counter()
            for i in range(n):
                for scrub, cs in ((True, a), (False, b)):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    await cs.record_exchange("c", f"q{i} " + USER, REPLY)
                    lat[scrub].append(time.perf_counter() - t0)
                    cpu[scrub].append(time.thread_time() - c0)
            elapsed = (time.perf_counter() - t_all) / 2
        for scrub in (False, True):
            _line(f"record path, scrub {'on ' if scrub else 'off'}", lat[scrub], elapsed)
            _line(f"  its event-loop CPU, scrub {'on ' if scrub else 'off'}", cpu[scrub])
        for what, data in (("wall", lat), ("event-loop CPU", cpu)):
            added = percentile(data[True], 50) - percentile(data[False], 50)
            print(f"  p50 added by scrubbing ({what}): {added * 1000:.3f} ms")


def scrub_only() -> None:
    s = Scrubber()
    two_kb = USER + REPLY
    prose = (Path(__file__).read_text() + USER + REPLY) * 200
    paste = (prose * (2**20 // len(prose) + 1))[: 2**20]
    blob = base64.b64encode(os.urandom(800_000)).decode()[: 2**20]
    for what, text, n in (("2 KB exchange", two_kb, 2000), ("1 MiB paste", paste, 15)):
        _line(f"scrub {what}", _times(lambda t=text: s.scrub(t, private=True), n))
    _line("scrub 1 MiB base64", _times(lambda: s.scrub(blob), 15))
    with tempfile.TemporaryDirectory(prefix="memd-bench-") as tmp:
        db = sqlite3.connect(Path(tmp) / "s.sqlite3", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        times = []
        for i in range(200):
            db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (i % 20, USER))
            t0 = time.perf_counter()
            truncate_wal(db)
            times.append(time.perf_counter() - t0)  # wall: it waits for the disk
        db.close()
    _line("WAL checkpoint(TRUNCATE)", times)


def _times(fn: Callable[[], object], n: int) -> list[float]:
    """CPU seconds of this thread per call: on a shared machine wall time mostly measures
    the other processes (a loaded 2-core box showed 10x the CPU time)."""
    out = []
    for _ in range(n):
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=300)
    ap.add_argument("--lib", type=int, default=400, help="exchanges per mode, in-process")
    args = ap.parse_args()
    print("record_exchange of a ~2 KB exchange (1 in 10 carries a GitHub token)")
    for redact in (False, True):
        socket_run(redact, args.clients, args.per_client)
    asyncio.run(lib_run(args.lib))
    scrub_only()


if __name__ == "__main__":
    main()
