"""Recall latency on real questions: LoCoMo's dev questions over its exchanges at 10k.

    .venv/bin/python bench/recall.py --questions               # 10,000 exchanges
    .venv/bin/python bench/recall.py --questions --exchanges 2000 --queries 100

The LoCoMo dev split's exchanges (bench/locomo.py's pairing of turns) are cycled until
--exchanges are recorded, all into one session of one client (one session file, as a
long-running assistant writes), one second apart. Once indexed, the dev questions
(shuffled, deterministic) are asked through `memory.recall` (top_k 5):

1. settled: after the index holds every chunk and --settle seconds have passed;
2. right after a burst: --burst more exchanges recorded (8 calls in flight), then the
   questions asked at once while the watcher indexes them.

The data is read from the locomo-dev folder (see bench/locomo.py); nothing of it is kept.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import locomo
from _daemon import (
    Connections,
    IndexView,
    machine,
    percentile,
    running_daemon,
    wait_indexed,
    wait_searchable,
)

CLIENT = "bench"


def cycled_exchanges(n: int, start: datetime) -> list[dict[str, Any]]:
    """n exchanges of the dev conversations, cycled, one second apart from `start`.

    Each LoCoMo session becomes its own memd conversation (its id names the round, so a
    second round starts new conversations rather than continuing old ones)."""
    folder = locomo.data_dir(None)
    pool = []
    for name in locomo.DEFAULT_IDS:
        conv = locomo.load(folder, name)
        for number, session in enumerate(locomo.exchanges(conv), 1):
            pool += [(f"{name}-{number}", ex) for ex in session]
    out = []
    for i in range(n):
        conv_id, ex = pool[i % len(pool)]
        out.append(
            {
                "conversation_id": f"{conv_id}-r{i // len(pool)}",
                "user": ex["user"],
                "assistant": ex["assistant"],
                "timestamp": (start + timedelta(seconds=i)).isoformat(),
            }
        )
    return out


def questions(n: int, seed: int) -> list[str]:
    folder = locomo.data_dir(None)
    texts = [q.text for name in locomo.DEFAULT_IDS for q in locomo.load(folder, name).questions]
    random.Random(seed).shuffle(texts)
    return [texts[i % len(texts)] for i in range(n)]


def ask(conns: Connections, queries: Sequence[str]) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        conns.call("memory.recall", {"client_id": CLIENT, "query": q, "top_k": 5})
        out.append((time.perf_counter() - t0) * 1000)
    return out


def row(label: str, ms: Sequence[float], load: str) -> str:
    return (
        f"| {label} | {len(ms)} | {percentile(list(ms), 50):.1f} | "
        f"{percentile(list(ms), 99):.1f} | {max(ms):.1f} | {load} |"
    )


def load_average() -> str:
    with open("/proc/loadavg", encoding="ascii") as fh:
        return " ".join(fh.read().split()[:3])


def run(exchanges: int, queries: int, burst: int, settle: float, seed: int, **config: Any) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=exchanges + burst + 60)
    data = cycled_exchanges(exchanges + burst, start)
    asked = questions(2 * queries, seed)
    print(machine())
    clients = {CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}}
    with running_daemon(clients=clients, **config) as memd:
        wait_searchable(memd, CLIENT)
        conns = Connections(memd)
        view = IndexView.of(memd, CLIENT)
        print(f"recording {exchanges} LoCoMo exchanges into one session ...", flush=True)
        took = _record(conns, data[:exchanges])
        chunks, lag, _ = wait_indexed(memd, view, CLIENT)
        print(f"  recorded in {took:.0f} s, indexed {lag:.0f} s later: {chunks} chunks", flush=True)
        time.sleep(settle)
        rows = [row("settled", ask(conns, asked[:queries]), load_average())]
        took = _record(conns, data[exchanges:])
        after = ask(conns, asked[queries:])
        rows.append(row(f"right after a burst of {burst} records", after, load_average()))
        chunks, lag, _ = wait_indexed(memd, view, CLIENT, progress=False)
        conns.close()
    print(f"\n{chunks} chunks; LoCoMo dev questions, top_k 5, latency over the socket in ms\n")
    print("| when | queries | p50 | p99 | max | load average (1, 5, 15 min) |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\nthe burst took {took:.1f} s to record; indexed {lag:.0f} s after the queries")
    print(f"at the end: {machine()}")


def _record(conns: Connections, exchanges: Sequence[dict[str, Any]]) -> float:
    """Record into the one open session (closing it would start a new file)."""
    with ThreadPoolExecutor(8) as pool:
        t0 = time.perf_counter()
        calls = [
            pool.submit(conns.call, "memory.record_exchange", {"client_id": CLIENT, **ex})
            for ex in exchanges
        ]
        for call in calls:
            call.result()
        return time.perf_counter() - t0
