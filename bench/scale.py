"""Cost of N enabled clients: RSS of memd and its children, idle CPU, time to ready.

    .venv/bin/python bench/scale.py [--clients 1 5 20] [--idle-seconds 30]

For each N: start memd with N enabled clients (each gets an index server and a
memsearch watch), time until every watcher is RUNNING, record one exchange per client so
every pipeline has done real work, then measure RSS (memd, and per client) and the CPU
used by memd plus all children over an idle window.
"""

from __future__ import annotations

import argparse
import time

import psutil
from _daemon import running_daemon
from _procs import idle_cpu_by_kind, tree


def rss_mb(procs: list[psutil.Process], kind: str = "rss") -> float:
    """RSS counts shared library pages once per process; PSS splits them fairly, so a
    sum of PSS is what N processes really cost together."""
    total = 0
    for p in procs:
        try:
            info = p.memory_full_info() if kind == "pss" else p.memory_info()
            total += getattr(info, kind)
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def all_running(status: dict, n: int) -> bool:
    clients = status["clients"]
    return len(clients) == n and all(
        (c.get("watcher") or {}).get("state") == "RUNNING" for c in clients.values()
    )


def measure(n: int, idle: float) -> dict[str, float]:
    clients = {f"c{i:02d}": {"memory_enabled": True, "mode": "mcp_via_llm"} for i in range(n)}
    started = time.monotonic()
    with running_daemon(clients=clients) as memd:
        while not all_running(memd.call("daemon.status"), n):
            time.sleep(0.2)
        ready = time.monotonic() - started
        for cid in clients:
            memd.call(
                "memory.record_exchange",
                {"client_id": cid, "conversation_id": "x", "user": "warm up", "assistant": "ok"},
            )
        time.sleep(5)  # let watchers index it and settle
        procs = tree(memd.proc.pid)
        memd_rss = rss_mb(procs[:1])
        total_rss = rss_mb(procs)
        memd_pss = rss_mb(procs[:1], "pss")
        total_pss = rss_mb(procs, "pss")
        cpu = idle_cpu_by_kind(memd.proc.pid, idle)
    return {
        "clients": n,
        "ready_s": ready,
        "memd_mb": memd_rss,
        "total_mb": total_rss,
        "per_client_mb": (total_rss - memd_rss) / n,
        "memd_pss": memd_pss,
        "total_pss": total_pss,
        "per_client_pss": (total_pss - memd_pss) / n,
        "idle_cpu_pct": cpu["total"],
        "idle_cpu_memd": cpu.get("memd", 0.0),
        "idle_cpu_children": cpu["total"] - cpu.get("memd", 0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    args = ap.parse_args()
    print("MB columns: RSS / PSS (PSS shares library pages among processes)")
    print(
        f"{'clients':>7} {'ready s':>8} {'memd MB':>11} {'total MB':>13} "
        f"{'per client MB':>13} {'idle CPU % (memd + children)':>28}"
    )
    for n in args.clients:
        r = measure(n, args.idle_seconds)
        print(
            f"{r['clients']:>7} {r['ready_s']:>8.1f} "
            f"{r['memd_mb']:>5.0f} /{r['memd_pss']:>4.0f} "
            f"{r['total_mb']:>6.0f} /{r['total_pss']:>5.0f} "
            f"{r['per_client_mb']:>6.0f} /{r['per_client_pss']:>5.0f} "
            f"{r['idle_cpu_pct']:>12.2f} ({r['idle_cpu_memd']:.2f} + "
            f"{r['idle_cpu_children']:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
