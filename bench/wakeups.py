"""Who wakes up while N clients idle: context switches per process kind and per thread.

    .venv/bin/python bench/wakeups.py [--clients 5] [--seconds 30] [--shared-index on|off]
                                      [--idle-minutes 0.25]

Starts memd with N enabled clients (watchers on demand with `--idle-minutes`, one shared
index server by default), records one exchange per client, waits until every watcher is
IDLE and no one-shot child is left, then counts the context switches (voluntary and not)
of every thread of every process of memd's tree over `--seconds` (from
/proc/<pid>/task/<tid>/status; a thread's name from .../comm). Each switch is one
wake-up of that thread. `bench/scale.py` gives the totals per kind; this says which
thread of which kind they come from (memd's event loop, the watchfiles threads, gRPC's
pollers, onnxruntime's pool, ...).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from typing import Any

from _daemon import machine, running_daemon
from _procs import KINDS, kind_of, tree
from scale import all_running, until


def thread_switches(pid: int) -> dict[tuple[int, str], int]:
    """{(tid, thread name): context switches so far} of one process."""
    out: dict[tuple[int, str], int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
            total = 0
            with open(f"{base}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue
        out[(int(tid), name)] = total
    return out


def sample(root: int, seconds: float) -> dict[str, dict[str, float]]:
    """{kind: {thread name: wake-ups/s}} over `seconds` (threads of one name summed; a
    process's main thread, which runs memd's event loop, is "<name> (main)")."""
    procs = tree(root)
    kinds = {p.pid: kind_of(p) for p in procs}
    before = {p.pid: thread_switches(p.pid) for p in procs}
    start = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - start
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in procs:
        after = thread_switches(p.pid)
        for key, count in after.items():
            delta = count - before[p.pid].get(key, 0)
            name = f"{key[1]} (main)" if key[0] == p.pid else key[1]
            out[kinds[p.pid]][name] += max(delta, 0) / wall
    return out


def measure(n: int, seconds: float, shared: bool, idle_minutes: float) -> dict[str, Any]:
    clients = {f"c{i:02d}": {"memory_enabled": True, "mode": "mcp_via_llm"} for i in range(n)}
    supervision = {"shared_index_server": shared, "watcher_idle_minutes": idle_minutes}
    up = ("RUNNING", "IDLE") if idle_minutes else ("RUNNING",)
    with running_daemon(clients=clients, supervision=supervision) as memd:
        until(lambda: all_running(memd.call("daemon.status"), n, up), 300)
        for cid in clients:
            memd.call(
                "memory.record_exchange",
                {"client_id": cid, "conversation_id": "x", "user": "warm up", "assistant": "ok"},
            )
        time.sleep(10)
        if idle_minutes:
            until(lambda: all_running(memd.call("daemon.status"), n, ("IDLE",)), 600)
        until(lambda: all(kind_of(p) != "other" for p in tree(memd.proc.pid)), 120)
        time.sleep(3)  # the last status call's own wake-ups are over
        by_thread = sample(memd.proc.pid, seconds)
    return {"clients": n, "load": os.getloadavg(), "threads": by_thread}


def report(r: dict[str, Any]) -> None:
    load = " ".join(f"{x:.2f}" for x in r["load"])
    print(f"\n{r['clients']} idle clients, load {load}: wake-ups/s per kind and thread")
    total = 0.0
    for kind in (*KINDS, "other"):
        threads = r["threads"].get(kind)
        if not threads:
            continue
        kind_total = sum(threads.values())
        total += kind_total
        print(f"  {kind:<13} {kind_total:6.2f}")
        for name, rate in sorted(threads.items(), key=lambda kv: -kv[1]):
            if rate >= 0.05:
                print(f"    {name:<17} {rate:6.2f}")
    print(f"  {'total':<13} {total:6.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[5])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--shared-index", choices=("on", "off"), default="on")
    ap.add_argument("--idle-minutes", type=float, default=0.25)
    args = ap.parse_args()
    print(machine())
    for n in args.clients:
        report(measure(n, args.seconds, args.shared_index == "on", args.idle_minutes))


if __name__ == "__main__":
    main()
