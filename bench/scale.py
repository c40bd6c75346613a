"""Cost of N enabled clients: memory per process kind, time to RUNNING, recovery, idle CPU.

    .venv/bin/python bench/scale.py [--clients 1 5 20] [--idle-seconds 60] [--no-zygote]
                                    [--shared-index off|on|both] [--on-demand off|on|both]

For each N: start memd with N enabled clients (each gets an index server and a memsearch
watch, forked from the zygote unless --no-zygote sets `supervision.zygote = false`; with
--shared-index on, `supervision.shared_index_server = true`: one index-server process for
all of them; `both` measures each N without, then with it), time
until every child is RUNNING, record one exchange per client so every pipeline has done
real work, then measure for memd, the zygote, the index servers and the watchers:

- RSS, PSS and USS from /proc/<pid>/smaps_rollup (PSS splits shared pages between the
  processes that map them, so a sum of PSS is what they cost together; USS is what each
  process alone holds);
- the CPU and the wake-ups per second (context switches of all threads, from
  /proc/<pid>/task/*/status) each kind uses over an idle window, and the CPU seconds it
  had used by the time all were RUNNING (start-up is CPU-bound on a busy 2-core box: this
  says how much work the wait was);
- kill -9 of one RUNNING watcher: until its replacement is RUNNING, and until an exchange
  recorded right after the kill is found by recall; with --on-demand on also kill -9 of a
  watcher still STARTING (woken from IDLE by a record, killed in its start-up scan): until
  its replacement is RUNNING.
- with --on-demand on (`supervision.watcher_idle_minutes`, see --idle-minutes) the
  watchers are parked once idle: the idle window is measured with them IDLE, and the
  first record after idle is timed until recall finds it (off: the same record, timed
  with the watcher running);
- memd's memory once more after that recall and the restart's catch-up, and whether it
  has loaded pymilvus's native stack (gRPC, pandas, pyarrow: issue 16 item 3) or the
  embedding model's runtime (onnxruntime, tokenizers: the embedder child's, issue 29).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
from _daemon import BROWSER_ON, machine, running_daemon
from _procs import KINDS, cpu_seconds, idle_by_kind, kind_of, tree

from memd.cli.client import RemoteError

FIELDS = {"rss": "Rss", "pss": "Pss"}


def smaps_rollup(pid: int) -> dict[str, float]:
    """MB of RSS, PSS and USS (private clean + private dirty) of one process."""
    kb: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                kb[parts[0][:-1]] = int(parts[1])
    uss = kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)
    return {"rss": kb.get("Rss", 0) / 1024, "pss": kb.get("Pss", 0) / 1024, "uss": uss / 1024}


def pymilvus_mapped(pid: int) -> bool:
    """Whether the process maps pymilvus's native stack (what importing pymilvus loads)."""
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
        return any(f"/{lib}/" in line for line in f for lib in ("grpc", "pandas", "pyarrow"))


def model_mapped(pid: int) -> bool:
    """Whether the process maps the embedding model's runtime (onnxruntime, tokenizers):
    since issue 29 the embedder child holds it, memd should not."""
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
        return any(f"/{lib}/" in line for line in f for lib in ("onnxruntime", "tokenizers"))


def memory_by_kind(pid: int) -> dict[str, dict[str, float]]:
    """{kind: {rss, pss, uss, n}} over memd's process tree, plus "total"."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for proc in tree(pid):
        try:
            mem = smaps_rollup(proc.pid)
        except OSError:
            continue
        for kind in (kind_of(proc), "total"):
            for key, value in mem.items():
                out[kind][key] += value
            out[kind]["n"] += 1
    return out


def cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds each kind of process has used since it started (start-up cost)."""
    out: dict[str, float] = defaultdict(float)
    for proc in tree(pid):
        out[kind_of(proc)] += cpu_seconds([proc])
    out["total"] = sum(out.values())
    return dict(out)


def all_running(status: dict[str, Any], n: int, watcher: tuple[str, ...] = ("RUNNING",)) -> bool:
    """Every index server RUNNING and every watcher in one of `watcher`'s states."""
    clients = status["clients"]
    return len(clients) == n and all(
        (c.get(k) or {}).get("state") in (("RUNNING",) if k == "index_server" else watcher)
        for c in clients.values()
        for k in ("index_server", "watcher")
    )


def until(predicate: Any, timeout: float = 120.0) -> float:
    """Seconds until predicate() is true (nan after timeout)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    return float("nan")


def first_record_after_idle(memd: Any, client: str) -> float:
    """Seconds from recording an exchange (to a client whose watcher may be IDLE) until
    recall finds it."""
    start = time.monotonic()
    memd.call(
        "memory.record_exchange",
        {
            "client_id": client,
            "conversation_id": "fresh",
            "user": "Which locker holds the canoe paddles?",
            "assistant": "The canoe paddles are in locker Gull-19.",
        },
    )
    waited = until(lambda: recall_finds(memd, client, "canoe paddles locker", "Gull-19"))
    return waited if waited != waited else time.monotonic() - start  # nan: not found


def recall_finds(memd: Any, client: str, query: str, needle: str) -> bool:
    try:
        result = memd.call("memory.recall", {"client_id": client, "query": query, "top_k": 10})
    except RemoteError:
        return False
    return any(needle in r["content"] for r in result["results"])


def kill_watcher(memd: Any, client: str, timeout: float = 120.0) -> tuple[float, float]:
    """Seconds from kill -9 of the watcher until its replacement is RUNNING, and until an
    exchange recorded right after the kill is recallable. Each is polled in its own thread:
    a recall can take a second under load, and must not delay seeing the RUNNING."""
    until(lambda: watcher(memd, client)["state"] == "RUNNING", timeout)
    old = watcher(memd, client)["pid"]
    killed = time.monotonic()
    os.kill(old, signal.SIGKILL)

    def replaced() -> bool:
        w = memd.call("daemon.status")["clients"][client]["watcher"]
        return w["pid"] not in (None, old) and w["state"] == "RUNNING"

    def since_kill(predicate: Any) -> float:
        while time.monotonic() - killed < timeout:
            if predicate():
                return time.monotonic() - killed
            time.sleep(0.02)
        return float("nan")

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(since_kill, replaced)
        memd.call(
            "memory.record_exchange",
            {
                "client_id": client,
                "conversation_id": "kill",
                "user": "Where is the spare key of the boathouse?",
                "assistant": "The spare boathouse key hangs behind the tide chart, tag Osprey-41.",
            },
        )
        found = pool.submit(
            since_kill, lambda: recall_finds(memd, client, "spare key boathouse", "Osprey-41")
        )
        return running.result(), found.result()


def watcher(memd: Any, client: str) -> dict[str, Any]:
    return memd.call("daemon.status")["clients"][client]["watcher"]


def kill_starting_watcher(memd: Any, client: str, timeout: float = 120.0) -> float:
    """Seconds from kill -9 of a watcher in its start-up (woken from IDLE by a record)
    until its replacement is RUNNING; nan if it was not caught STARTING."""
    if not until(lambda: watcher(memd, client)["state"] == "IDLE", 600) >= 0:
        return float("nan")
    memd.call(
        "memory.record_exchange",
        {"client_id": client, "conversation_id": "wake", "user": "wake up", "assistant": "ok"},
    )
    until(lambda: watcher(memd, client)["pid"] is not None, timeout)
    w = watcher(memd, client)
    if w["state"] != "STARTING":
        return float("nan")
    killed = time.monotonic()
    os.kill(w["pid"], signal.SIGKILL)
    back = until(
        lambda: (lambda x: x["pid"] not in (None, w["pid"]) and x["state"] == "RUNNING")(
            watcher(memd, client)
        ),
        timeout,
    )
    return back if back != back else time.monotonic() - killed


def measure(
    n: int, idle: float, zygote: bool, shared: bool = False, idle_minutes: float | None = None
) -> dict[str, Any]:
    clients = {f"c{i:02d}": {"memory_enabled": True, "mode": "mcp_via_llm"} for i in range(n)}
    supervision: dict[str, Any] = {"zygote": zygote, "shared_index_server": shared}
    if idle_minutes is not None:  # None: a memd before issue 29, which has no such key
        supervision["watcher_idle_minutes"] = idle_minutes
    up = ("RUNNING", "IDLE") if idle_minutes else ("RUNNING",)
    started = time.monotonic()
    with running_daemon(clients=clients, supervision=supervision, **BROWSER_ON) as memd:
        answered = time.monotonic() - started
        while not all_running(memd.call("daemon.status"), n, up):
            time.sleep(0.1)
        ready = time.monotonic() - started
        start_cpu = cpu_by_kind(memd.proc.pid)
        for cid in clients:
            memd.call(
                "memory.record_exchange",
                {"client_id": cid, "conversation_id": "x", "user": "warm up", "assistant": "ok"},
            )
        time.sleep(10)  # let watchers index it and settle
        if idle_minutes:
            until(lambda: all_running(memd.call("daemon.status"), n, ("IDLE",)), 600)
        # a one-shot catch-up child still running would count as "other" (and its exit
        # during the window as negative CPU): measure once none is left
        until(lambda: all(kind_of(p) != "other" for p in tree(memd.proc.pid)), 120)
        mem = memory_by_kind(memd.proc.pid)
        cpu, wakes = idle_by_kind(memd.proc.pid, idle)
        fresh = first_record_after_idle(memd, "c00")
        until(lambda: memd.call("daemon.status")["clients"]["c00"]["watcher"]["pid"])
        restart, recallable = kill_watcher(memd, "c00")
        time.sleep(3)  # the restart's catch-up (in memd before issue 16 item 3) has run
        starting = kill_starting_watcher(memd, "c00") if idle_minutes else float("nan")
        after = smaps_rollup(memd.proc.pid)
        after["pymilvus"] = float(pymilvus_mapped(memd.proc.pid))
        after["model"] = float(model_mapped(memd.proc.pid))
        forked = (memd.call("daemon.status").get("zygote") or {}).get("forked", 0)
    return {
        "clients": n,
        "zygote": zygote,
        "shared": shared,
        "load": os.getloadavg()[0],
        "answered_s": answered,
        "ready_s": ready,
        "start_cpu": start_cpu,
        "mem": mem,
        "cpu": cpu,
        "wakes": wakes,
        "fresh_s": fresh,
        "idle_minutes": idle_minutes,
        "restart_s": restart,
        "recallable_s": recallable,
        "starting_kill_s": starting,
        "forked": forked,
        "memd_after": after,
    }


def report(r: dict[str, Any]) -> None:
    n, mem, cpu = r["clients"], r["mem"], r["cpu"]
    print(
        f"\n{n} clients, zygote {'on' if r['zygote'] else 'off'} ({r['forked']} forked), "
        f"shared index server {'on' if r['shared'] else 'off'}, load {r['load']:.2f}: "
        f"memd answered {r['answered_s']:.1f} s, all children RUNNING {r['ready_s']:.1f} s "
        f"after start; killed watcher RUNNING again {r['restart_s']:.2f} s, exchange "
        f"recorded meanwhile recallable {r['recallable_s']:.2f} s after the kill",
        flush=True,
    )
    print(
        f"  watchers on demand: {r['idle_minutes'] or 0:g} min idle "
        f"({'off' if not r['idle_minutes'] else 'on'}); first record after idle "
        f"recallable {r['fresh_s']:.2f} s after it was recorded; a watcher killed while "
        f"STARTING RUNNING again {r['starting_kill_s']:.2f} s after the kill"
    )
    print(
        f"  {'kind':<13} {'n':>3} {'RSS MB':>8} {'PSS MB':>8} {'USS MB':>8} "
        f"{'PSS/proc':>9} {'idle CPU %':>10} {'wakeups/s':>9} {'start CPU s':>11}"
    )
    for kind in (*KINDS, "other", "total"):
        m = mem.get(kind)
        if not m:
            continue
        count = int(m["n"])
        print(
            f"  {kind:<13} {count:>3} {m['rss']:>8.0f} {m['pss']:>8.0f} {m['uss']:>8.0f} "
            f"{m['pss'] / count:>9.1f} {cpu.get(kind, 0.0):>10.2f} "
            f"{r['wakes'].get(kind, 0.0):>9.1f} {r['start_cpu'].get(kind, 0.0):>11.1f}"
        )
    after = r["memd_after"]
    print(
        f"  memd after a recall and a catch-up: {after['rss']:.0f} MB RSS, "
        f"{after['pss']:.0f} MB PSS, {after['uss']:.0f} MB USS; pymilvus's stack "
        f"(gRPC, pandas, pyarrow) {'loaded' if after['pymilvus'] else 'not loaded'}, "
        f"the model's runtime {'loaded' if after.get('model') else 'not loaded'}"
    )
    children = mem["total"]["pss"] - mem.get("memd", {}).get("pss", 0.0)
    print(
        f"  per client (children + zygote share): {children / n:.0f} MB PSS; "
        f"total PSS {mem['total']['pss']:.0f} MB",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--no-zygote", action="store_true", help="supervision.zygote = false")
    ap.add_argument(
        "--shared-index",
        choices=("off", "on", "both"),
        default="off",
        help="supervision.shared_index_server; both: each N without it, then with it",
    )
    ap.add_argument(
        "--on-demand",
        choices=("none", "off", "on", "both"),
        default="off",
        help="watchers on demand (supervision.watcher_idle_minutes): off is 0; both: each "
        "N without, then with; none: the key is not written (a memd without it)",
    )
    ap.add_argument("--idle-minutes", type=float, default=0.25, help="watcher_idle_minutes when on")
    args = ap.parse_args()
    shared = {"off": (False,), "on": (True,), "both": (False, True)}[args.shared_index]
    idles: dict[str, tuple[float | None, ...]] = {
        "none": (None,),
        "off": (0.0,),
        "on": (args.idle_minutes,),
        "both": (0.0, args.idle_minutes),
    }
    print(machine(), f"(psutil {psutil.__version__})")
    for n in args.clients:
        for on in shared:
            for minutes in idles[args.on_demand]:
                report(
                    measure(
                        n, args.idle_seconds, not args.no_zygote, shared=on, idle_minutes=minutes
                    )
                )
    print(machine())


if __name__ == "__main__":
    main()
