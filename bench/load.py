"""Sustained load: many clients and connections record and recall; errors, latency, RSS trend.

    .venv/bin/python bench/load.py [--clients 20] [--connections 8] [--seconds 120]
                                   [--think 0.5] [--recall-share 0.3] [--idle 30]
                                   [--cooldown 30] [--json OUT]

One real memd with `--clients` enabled clients (even ones mcp_via_llm, recorded with
`memory.record_exchange`; odd ones `both`, recorded with `memory.record_chat`, whole
history resent every turn, a new chat every 20 turns). Each client is one process with
`--connections` threads, each its own socket connection with one call in flight, pausing
`--think` seconds between calls; a `--recall-share` of the calls are `memory.recall`.

Prints, in this order: start-up (memd ready, every index server and watcher RUNNING);
idle cost before the load (RSS and PSS of memd and per client, CPU of memd and all its
children); under load, RSS of memd + children sampled every `--sample` seconds with the
slope of a linear fit over the second half and over each quarter (the growth trend, and
whether it levels off); per method: calls, errors by
kind, and latency percentiles; memory again `--cooldown` seconds after the load. Asserts
nothing: targets are checked by people.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import resource
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from _daemon import BROWSER_ON, lost_watch_events, machine, percentile, running_daemon
from _procs import KINDS, cpu_seconds, idle_cpu_by_kind, rss_by_kind, slope_per_minute, tree

from memd.cli.client import ClientError, MemdClient, RemoteError

TOPICS = [
    "sourdough",
    "bouldering",
    "Kubernetes",
    "tomatoes",
    "Lisbon",
    "PostgreSQL",
    "watercolour",
    "bike lock",
    "passport",
    "Rust",
    "kayaking",
    "saffron",
    "Tbilisi",
    "astronomy",
    "beekeeping",
    "TLS",
    "chess",
    "Hanoi",
    "polenta",
    "systemd",
]
FILLER = (
    "Start small, measure, and only then decide whether the extra complexity pays "
    "off. Write the result down somewhere you will find it again. "
)
CHAT_TURNS = 20


# --- the load generator (runs in worker processes) --------------------------------------------


def client_ids(n: int) -> list[str]:
    return [f"c{i:02d}" for i in range(n)]


def is_chat(client_id: str) -> bool:
    return int(client_id[1:]) % 2 == 1


def text(rng: random.Random, kind: str, i: int) -> str:
    topic = rng.choice(TOPICS)
    return f"{kind} {i} about {topic}: " + FILLER * rng.randint(1, 4)


def connection(
    sock: str,
    client_id: str,
    k: int,
    deadline: float,
    think: float,
    recall_share: float,
    out: list[tuple[str, float, str | None]],
) -> None:
    """One connection's loop: record (exchange or chat) or recall, one call at a time."""
    rng = random.Random(f"{client_id}-{k}")
    history: list[dict[str, Any]] = []
    chats = turn = 0
    with MemdClient(Path(sock), timeout=120) as conn:
        while time.monotonic() < deadline:
            if rng.random() < recall_share:
                method = "memory.recall"
                params: dict[str, Any] = {
                    "client_id": client_id,
                    "query": f"{rng.choice(TOPICS)} advice",
                }
            elif is_chat(client_id):
                method = "memory.record_chat"
                if not history or turn >= CHAT_TURNS:
                    chats += 1
                    turn = 0
                    history = [{"role": "system", "content": f"chat {k}.{chats}"}]
                user = {"role": "user", "content": text(rng, "question", turn)}
                reply = {"role": "assistant", "content": text(rng, "answer", turn)}
                params = {"client_id": client_id, "messages": [*history, user], "response": reply}
            else:
                method = "memory.record_exchange"
                params = {
                    "client_id": client_id,
                    "conversation_id": f"conv-{k}",
                    "user": text(rng, "question", turn),
                    "assistant": text(rng, "answer", turn),
                }
            started = time.perf_counter()
            error = None
            try:
                conn.call(method, params)
            except RemoteError as exc:
                error = exc.kind or str(exc.code)
            except ClientError as exc:
                error = f"client: {exc}"
                out.append((method, time.perf_counter() - started, error))
                return
            out.append((method, time.perf_counter() - started, error))
            if method == "memory.record_chat" and error is None:
                history = [*params["messages"], params["response"]]
                turn += 1
            elif method == "memory.record_exchange":
                turn += 1
            if think:
                time.sleep(think * rng.uniform(0.5, 1.5))


def worker(
    sock: str,
    client_id: str,
    connections: int,
    start_at: float,
    seconds: float,
    think: float,
    recall_share: float,
    queue: mp.Queue,
) -> None:
    """One client: `connections` threads; sends all samples back when done."""
    while time.time() < start_at:
        time.sleep(0.01)
    deadline = time.monotonic() + seconds
    samples: list[tuple[str, float, str | None]] = []
    threads = [
        threading.Thread(
            target=connection, args=(sock, client_id, k, deadline, think, recall_share, samples)
        )
        for k in range(connections)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    queue.put((client_id, samples, usage.ru_utime + usage.ru_stime))


# --- measuring memd ----------------------------------------------------------------------------


def wait_all_running(memd: Any, n: int, timeout: float = 900.0) -> float:
    """Seconds until every client's index server and watcher is RUNNING."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        clients = memd.call("daemon.status")["clients"]
        up = sum(
            1
            for c in clients.values()
            for name in ("index_server", "watcher")
            if (c.get(name) or {}).get("state") == "RUNNING"
        )
        if up == 2 * n:
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"not every pipeline was RUNNING after {timeout} s")


def idle_cost(memd: Any, pid: int, n: int, seconds: float) -> dict[str, float]:
    """RSS and CPU of memd and its children while nothing is asked of them."""
    cpu = idle_cpu_by_kind(pid, seconds)
    return {
        "cpu_percent_of_one_core": cpu["total"],
        **{f"cpu_percent_{kind}": cpu.get(kind, 0.0) for kind in KINDS},
        **memory(pid, n),
    }


def memory(pid: int, n: int) -> dict[str, float]:
    """RSS and PSS of memd, per client (index server + watcher) and in total, in MB."""
    out: dict[str, float] = {}
    for kind in ("rss", "pss"):
        mb = rss_by_kind(pid, kind)
        out |= {
            f"memd_{kind}": mb.get("memd", 0.0),
            f"per_client_{kind}": (mb.get("index_server", 0.0) + mb.get("watcher", 0.0)) / n,
            f"index_server_{kind}": mb.get("index_server", 0.0) / n,
            f"watcher_{kind}": mb.get("watcher", 0.0) / n,
            f"total_{kind}": mb["total"],
        }
    return out


def print_memory(label: str, mem: dict[str, float]) -> None:
    for kind in ("rss", "pss"):
        print(
            f"  {label} {kind.upper()}: memd {mem[f'memd_{kind}']:.0f} MB, per client "
            f"{mem[f'per_client_{kind}']:.0f} MB (index server "
            f"{mem[f'index_server_{kind}']:.0f} + watcher {mem[f'watcher_{kind}']:.0f}), "
            f"total {mem[f'total_{kind}']:.0f} MB"
        )


def sample_rss(
    pid: int, every: float, stop: threading.Event, out: list[tuple[float, dict[str, float]]]
) -> None:
    start = time.monotonic()
    while not stop.is_set():
        out.append((time.monotonic() - start, rss_by_kind(pid)))
        stop.wait(every)


# --- reporting ---------------------------------------------------------------------------------


def report_latency(samples: list[tuple[str, float, str | None]], seconds: float) -> dict:
    by_method: dict[str, list[tuple[float, str | None]]] = defaultdict(list)
    for method, latency, error in samples:
        by_method[method].append((latency, error))
    table = {}
    print(
        f"{'method':<24}{'calls':>8}{'per s':>8}{'errors':>8}{'p50 ms':>9}{'p90 ms':>9}"
        f"{'p99 ms':>9}{'max ms':>9}"
    )
    for method in sorted(by_method):
        rows = by_method[method]
        lat = [x * 1000 for x, _ in rows]
        errors = Counter(e for _, e in rows if e)
        row = {
            "calls": len(rows),
            "per_second": len(rows) / seconds,
            "errors": dict(errors),
            "p50": percentile(lat, 50),
            "p90": percentile(lat, 90),
            "p99": percentile(lat, 99),
            "max": max(lat),
        }
        table[method] = row
        print(
            f"{method:<24}{row['calls']:>8}{row['per_second']:>8.1f}{sum(errors.values()):>8}"
            f"{row['p50']:>9.1f}{row['p90']:>9.1f}{row['p99']:>9.1f}{row['max']:>9.1f}"
        )
        for kind, count in errors.most_common():
            print(f"    error {kind}: {count}")
    return table


def report_rss(series: list[tuple[float, dict[str, float]]]) -> dict:
    """The slope by quarter tells growth that levels off (caches filling up to their
    bound, a heap warming) from a leak, which keeps the same slope to the end."""
    end = series[-1][0]
    half = [p for p in series if p[0] >= end / 2]
    quarters = [[p for p in series if q * end / 4 <= p[0] <= (q + 1) * end / 4] for q in range(4)]
    out = {}
    print(
        f"{'RSS (MB)':<16}{'first':>9}{'last':>9}{'max':>9}{'slope 2nd half':>17}"
        f"   slope by quarter (MB/min)"
    )
    for kind in ("memd", "index_server", "watcher", "total"):
        values = [(t, s.get(kind, 0.0)) for t, s in series]
        slope = slope_per_minute([(t, s.get(kind, 0.0)) for t, s in half])
        by_quarter = [slope_per_minute([(t, s.get(kind, 0.0)) for t, s in q]) for q in quarters]
        out[kind] = {
            "first": values[0][1],
            "last": values[-1][1],
            "max": max(v for _, v in values),
            "slope_mb_per_min": slope,
            "slope_by_quarter": by_quarter,
        }
        print(
            f"{kind:<16}{values[0][1]:>9.1f}{values[-1][1]:>9.1f}"
            f"{out[kind]['max']:>9.1f}{slope:>12.2f} MB/min   "
            + " ".join(f"{q:>6.2f}" for q in by_quarter)
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--connections", type=int, default=8, help="per client")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument(
        "--think",
        type=float,
        default=0.5,
        help="mean pause between one connection's calls (0: flat out)",
    )
    ap.add_argument("--recall-share", type=float, default=0.3)
    ap.add_argument("--idle", type=float, default=30.0, help="idle window before the load")
    ap.add_argument("--sample", type=float, default=5.0, help="RSS sampling interval")
    ap.add_argument(
        "--cooldown",
        type=float,
        default=30.0,
        help="idle seconds after the load before memory is measured again",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--shared-index", action="store_true", help="supervision.shared_index_server = true"
    )
    args = ap.parse_args()

    ids = client_ids(args.clients)
    clients = {
        c: {"memory_enabled": True, "mode": "both" if is_chat(c) else "mcp_via_llm"} for c in ids
    }
    print(machine())
    print(
        f"{args.clients} clients x {args.connections} connections, {args.seconds:g} s, "
        f"think {args.think:g} s, recall share {args.recall_share:g}"
    )
    figures: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}, "machine": machine()}
    t0 = time.monotonic()
    supervision = {"shared_index_server": args.shared_index}
    with running_daemon(clients=clients, supervision=supervision, **BROWSER_ON) as memd:
        assert memd.proc is not None
        pid = memd.proc.pid
        ready = time.monotonic() - t0
        running = ready + wait_all_running(memd, args.clients)
        print(
            f"start-up: memd ready {ready:.1f} s, all {2 * args.clients} index servers "
            f"and watchers RUNNING {running:.1f} s"
        )
        figures["startup"] = {"ready_s": ready, "all_running_s": running}

        time.sleep(10)  # let the watchers' start-up scans settle
        idle = idle_cost(memd, pid, args.clients, args.idle)
        figures["idle"] = idle
        print(
            f"idle ({args.idle:g} s): CPU {idle['cpu_percent_of_one_core']:.2f}% of one core "
            f"(memd {idle['cpu_percent_memd']:.2f}, index servers "
            f"{idle['cpu_percent_index_server']:.2f}, "
            f"watchers {idle['cpu_percent_watcher']:.2f})"
        )
        print_memory("idle", idle)

        ctx = mp.get_context("spawn")
        queue: mp.Queue = ctx.Queue()
        start_at = time.time() + 3.0
        workers = [
            ctx.Process(
                target=worker,
                args=(
                    str(memd.socket),
                    c,
                    args.connections,
                    start_at,
                    args.seconds,
                    args.think,
                    args.recall_share,
                    queue,
                ),
            )
            for c in ids
        ]
        for w in workers:
            w.start()
        while time.time() < start_at:
            time.sleep(0.01)
        procs = tree(pid)
        cpu_before, wall_before = cpu_seconds(procs), time.monotonic()
        series: list[tuple[float, dict[str, float]]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=(pid, args.sample, stop, series))
        sampler.start()
        samples: list[tuple[str, float, str | None]] = []
        load_cpu = 0.0
        for _ in workers:
            _client, got, used = queue.get()
            samples += got
            load_cpu += used
        elapsed = time.monotonic() - wall_before
        cpu = (cpu_seconds(procs) - cpu_before) / elapsed
        stop.set()
        sampler.join()
        for w in workers:
            w.join()
        time.sleep(args.cooldown)  # the watchers finish indexing what was recorded
        after = memory(pid, args.clients)
        figures["after_load"] = after
        status = memd.call("daemon.status")["clients"]
        restarts = {
            c: {n: (status[c].get(n) or {}).get("restarts") for n in ("index_server", "watcher")}
            for c in ids
        }
        lost = {c: lost_watch_events(memd, c) for c in ids}

    print(
        f"\nunder load ({elapsed:.0f} s): memd + children used {100 * cpu:.0f}% of one core;"
        f" the load generator {100 * load_cpu / elapsed:.0f}%"
    )
    figures["load"] = {
        "seconds": elapsed,
        "cpu_percent_of_one_core": 100 * cpu,
        "generator_cpu_percent": 100 * load_cpu / elapsed,
    }
    figures["latency"] = report_latency(samples, elapsed)
    print()
    figures["rss"] = report_rss(series)
    print(f"\n{args.cooldown:g} s after the load:")
    print_memory("", after)
    figures["restarts"] = {c: r for c, r in restarts.items() if any(r.values())}
    figures["lost_watch_events"] = {c: n for c, n in lost.items() if n}
    print(f"\nchild restarts during the run: {figures['restarts'] or 'none'}")
    print(f"watch events memsearch dropped: {figures['lost_watch_events'] or 'none'}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
