"""Benchmark of the recording library alone (no socket): fsync cost, throughput, latency.

Run: .venv/bin/python bench/record_lib.py [--seconds 3]
Prints figures only; asserts nothing (speed targets are checked by people, not tests).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memd.layout import ClientLayout
from memd.sessions import chat
from memd.sessions.tracker import ClientSessions

PAYLOAD = "word " * 100  # ~500 characters per message, a typical short turn


def fsync_cost(folder: Path, n: int = 300) -> None:
    path = folder / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        os.write(fd, b"x" * 1200)
        os.fdatasync(fd)
        times.append(time.perf_counter() - t)
    os.close(fd)
    _line("append 1.2 kB + fdatasync", times)
    db = sqlite3.connect(folder / "fsync.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (k BLOB PRIMARY KEY, v INTEGER)")
    times = []
    for i in range(n):
        t = time.perf_counter()
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES (?, ?)", (os.urandom(16), i))
        db.execute("COMMIT")
        times.append(time.perf_counter() - t)
    db.close()
    _line("sqlite WAL FULL commit", times)


def _line(what: str, seconds: list[float]) -> None:
    ms = sorted(x * 1000 for x in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"  {what:<44} n={len(ms):>6}  p50 {statistics.median(ms):7.3f} ms"
        f"  p99 {p99:7.3f} ms  max {ms[-1]:7.3f} ms"
    )


async def _client_loop(cs: ClientSessions, worker: int, until: float, lat: list[float]) -> None:
    i = 0
    while time.perf_counter() < until:
        t = time.perf_counter()
        await cs.record_exchange(f"conv-{worker}", f"{PAYLOAD} {i}", f"{PAYLOAD} reply {i}")
        lat.append(time.perf_counter() - t)
        i += 1


async def concurrent(root: Path, clients: int, workers: int, seconds: float) -> None:
    """`workers` coroutines, each with one call in flight, spread over `clients` clients."""
    stores = [await ClientSessions(ClientLayout(root, f"bench{c}")).open() for c in range(clients)]
    lat: list[float] = []
    until = time.perf_counter() + seconds
    start = time.perf_counter()
    await asyncio.gather(
        *(_client_loop(stores[w % clients], w, until, lat) for w in range(workers))
    )
    elapsed = time.perf_counter() - start
    for cs in stores:
        await cs.close()
    print(f"  {workers} callers on {clients} client(s): {len(lat) / elapsed:8.0f} exchanges/s")
    _line("  record_exchange latency", lat)


def _history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "bench"}]
    for i in range(n // 2):
        out += [
            {"role": "user", "content": f"{PAYLOAD} q{i}"},
            {"role": "assistant", "content": f"{PAYLOAD} a{i}"},
        ]
    return out


async def long_history(root: Path) -> None:
    """Continuation cost against history length: should grow only with hashing the request."""
    async with ClientSessions(ClientLayout(root, "history")) as cs:
        for n in (10, 1_000, 10_000):
            history = _history(n)
            await cs.record_chat(history[:-1], history[-1])
            times, prep = [], []
            for turn in range(20):
                history += [{"role": "user", "content": f"new {turn}"}]
                t = time.perf_counter()
                chat.prepare(history, {"content": f"reply {turn}"})
                prep.append(time.perf_counter() - t)
                t = time.perf_counter()
                r = await cs.record_chat(history, {"content": f"reply {turn}"})
                times.append(time.perf_counter() - t)
                assert r["match"] == "continuation" and r["appended"] == 2
                history += [{"role": "assistant", "content": f"reply {turn}"}]
            _line(f"record_chat continuation, {n:>6} messages", times)
            _line("  of which validate+hash (chat.prepare)", prep)


async def main(seconds: float) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, dir {root}")
        print("disk:")
        fsync_cost(root)
        print("throughput (one event loop, library only):")
        await concurrent(root / "a", clients=1, workers=1, seconds=seconds)
        await concurrent(root / "b", clients=1, workers=8, seconds=seconds)
        await concurrent(root / "c", clients=8, workers=8, seconds=seconds)
        await concurrent(root / "d", clients=8, workers=64, seconds=seconds)
        print("long histories:")
        await long_history(root / "e")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    asyncio.run(main(parser.parse_args().seconds))
