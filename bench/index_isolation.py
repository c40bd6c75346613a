"""How far one client's index trouble reaches the others: a server per client vs shared.

    .venv/bin/python bench/index_isolation.py [--clients 5] [--records 100] [--batch 150]

For each kind (`[supervision] shared_index_server` false, then true) start memd with N
clients, record `--records` exchanges into each and wait until they are indexed, then:

- recall latency of another client (the last, whose database the shared server reopens
  last) at rest, then while c00 indexes a batch of `--batch` hand-written session files
  (4 notes each): p50 and max, and how many recalls failed;
- kill -9 of the process serving c00's index: how long the last client's recall was
  unavailable (0 when it never failed), how long until c00's recall answers again, and until the
  replacement is RUNNING.

The test of the same (tests/test_shared_index_isolation.py) asserts only that recall
answers; the figures are here. Prints the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from _daemon import machine, running_daemon

from memd.cli.client import RemoteError


def recall(memd: Any, client: str, query: str) -> float | None:
    """Seconds one recall took; None when it failed."""
    start = time.monotonic()
    try:
        memd.call("memory.recall", {"client_id": client, "query": query, "top_k": 5})
    except RemoteError:
        return None
    return time.monotonic() - start


def fill(memd: Any, clients: list[str], records: int) -> None:
    for cid in clients:
        for i in range(records):
            memd.call(
                "memory.record_exchange",
                {
                    "client_id": cid,
                    "conversation_id": f"fill{i // 20}",
                    "user": f"What is stored in bin {i} of {cid}?",
                    "assistant": f"Bin {i} of {cid} holds spare parts, label Fill-{cid}-{i}.",
                },
            )
    for cid in clients:
        needle = f"Fill-{cid}-{records - 1}"
        while not found(memd, cid, f"bin {records - 1} of {cid}", needle):
            time.sleep(0.2)


def found(memd: Any, client: str, query: str, needle: str) -> bool:
    try:
        out = memd.call("memory.recall", {"client_id": client, "query": query, "top_k": 10})
    except RemoteError:
        return False
    return any(needle in r["content"] for r in out["results"])


def write_batch(sessions: Path, batch: int) -> None:
    for i in range(batch):
        notes = "\n\n".join(
            f"## Note {i}.{j}\n\nCrate {i}-{j} of the harbour inventory holds "
            f"{'rope, tar, sailcloth and lamp oil ' * 6}tagged Lot-{i}-{j}."
            for j in range(4)
        )
        (sessions / f"batch-{i:03d}.md").write_text(f"# Inventory {i}\n\n{notes}\n")


def during_batch(memd: Any, folder: Path, batch: int, other: str) -> dict[str, Any]:
    """The last client's recall latencies while c00 indexes the batch (to its last note)."""
    write_batch(folder / "memory" / "c00" / "sessions", batch)
    times: list[float] = []
    failed = 0
    start = time.monotonic()
    last = f"Lot-{batch - 1}-3"
    while not found(memd, "c00", f"crate harbour inventory {last}", last):
        took = recall(memd, other, "what is in bin 7")
        if took is None:
            failed += 1
        else:
            times.append(took)
        if time.monotonic() - start > 900:
            break
    return {"indexed_s": time.monotonic() - start, "times": times, "failed": failed}


def kill_server(memd: Any, other: str) -> dict[str, float]:
    """kill -9 of c00's index server: the last client's recall outage, c00's, the new one."""
    old = memd.call("daemon.status")["clients"]["c00"]["index_server"]["pid"]
    killed = time.monotonic()
    os.kill(old, signal.SIGKILL)
    own_back = running = float("nan")
    other_last_fail = 0.0  # when the last client's recall last failed (0: it never did)
    while time.monotonic() - killed < 120 and (own_back != own_back or running != running):
        if recall(memd, other, "what is in bin 7") is None:
            other_last_fail = time.monotonic() - killed
        if own_back != own_back and recall(memd, "c00", "what is in bin 7") is not None:
            own_back = time.monotonic() - killed
        status = memd.call("daemon.status")["clients"]["c00"]["index_server"]
        if running != running and status["pid"] not in (None, old) and status["state"] == "RUNNING":
            running = time.monotonic() - killed
        time.sleep(0.02)
    return {"other_unavailable_s": other_last_fail, "own_back_s": own_back, "running_s": running}


def measure(n: int, records: int, batch: int, shared: bool) -> dict[str, Any]:
    clients = {f"c{i:02d}": {"memory_enabled": True, "mode": "mcp_via_llm"} for i in range(n)}
    other = f"c{n - 1:02d}"  # the last: the shared server reopens its database last
    supervision = {"shared_index_server": shared, "watcher_idle_minutes": 0}
    with running_daemon(clients=clients, supervision=supervision) as memd:
        folder = memd.config_path.parent
        while not all(
            (c.get(k) or {}).get("state") == "RUNNING"
            for c in memd.call("daemon.status")["clients"].values()
            for k in ("index_server", "watcher")
        ):
            time.sleep(0.1)
        fill(memd, sorted(clients), records)
        rest = [t for t in (recall(memd, other, "what is in bin 7") for _ in range(20)) if t]
        busy = during_batch(memd, folder, batch, other)
        outage = kill_server(memd, other)
    return {"shared": shared, "load": os.getloadavg(), "rest": rest, "busy": busy, **outage}


def report(r: dict[str, Any]) -> None:
    kind = "shared" if r["shared"] else "per client"
    busy = r["busy"]["times"] or [float("nan")]
    print(
        f"\n{kind}, load {r['load'][0]:.2f} {r['load'][1]:.2f}:\n"
        f"  last client's recall at rest: p50 {statistics.median(r['rest']) * 1000:.0f} ms, "
        f"max {max(r['rest']) * 1000:.0f} ms\n"
        f"  last client's recall while c00 indexes the batch ({r['busy']['indexed_s']:.0f} s, "
        f"{len(r['busy']['times'])} recalls, {r['busy']['failed']} failed): "
        f"p50 {statistics.median(busy) * 1000:.0f} ms, max {max(busy) * 1000:.0f} ms\n"
        f"  kill -9 of c00's index server: the last client's recall failing until "
        f"{r['other_unavailable_s']:.2f} s, c00's back {r['own_back_s']:.2f} s, "
        f"replacement RUNNING {r['running_s']:.2f} s",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--batch", type=int, default=150)
    ap.add_argument("--kinds", choices=("both", "off", "on"), default="both")
    args = ap.parse_args()
    print(machine())
    kinds = {"both": (False, True), "off": (False,), "on": (True,)}[args.kinds]
    for shared in kinds:
        report(measure(max(args.clients, 2), args.records, args.batch, shared))
    print(machine())


if __name__ == "__main__":
    main()
