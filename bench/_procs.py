"""Benchmark support: memd's process tree measured by kind (memd, zygote, index servers,
watchers, the embedder).

RSS counts shared library pages once per process; PSS splits them between the processes
that map them, so a sum of PSS is what N processes really cost together.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict

import psutil

KINDS = ("memd", "zygote", "index_server", "watcher", "embedder")


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def kind_of(proc: psutil.Process) -> str:
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    if "memd.supervision.zygote" in line:  # first: its argv names the modules it forks
        return "zygote"
    if (
        "memd.indexing.children.index_server" in line
        or "memd.indexing.children.shared_index_server" in line
    ):
        return "index_server"
    if "memd.indexing.children.embedder" in line:
        return "embedder"
    watcher = "memd.indexing.watch" in line or "memsearch" in line
    if watcher and " watch " in f" {line} ":
        return "watcher"
    if "memd.cli" in line:
        return "memd"
    return "other"


def rss_by_kind(pid: int, kind: str = "rss") -> dict[str, float]:
    """MB of RSS (or PSS) per kind of process and the total."""
    out: dict[str, float] = defaultdict(float)
    for proc in tree(pid):
        try:
            info = proc.memory_full_info() if kind == "pss" else proc.memory_info()
            out[kind_of(proc)] += getattr(info, kind) / 2**20
        except psutil.Error:
            continue
    out["total"] = sum(v for k, v in out.items() if k != "total")
    return dict(out)


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def idle_cpu_by_kind(pid: int, seconds: float) -> dict[str, float]:
    """Percent of one core used over `seconds` per kind of process, and the total."""
    procs = tree(pid)
    kinds = {p.pid: kind_of(p) for p in procs}
    before = {p.pid: cpu_seconds([p]) for p in procs}
    start = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - start
    out: dict[str, float] = defaultdict(float)
    for p in procs:
        out[kinds[p.pid]] += 100 * (cpu_seconds([p]) - before[p.pid]) / wall
    out["total"] = sum(v for k, v in out.items() if k != "total")
    return dict(out)


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) in MB per minute."""
    if len(points) < 2:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return float("nan")
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def _switches(pid: int) -> int:
    """Context switches (voluntary + not) of every thread of `pid` so far: each one is a
    wake-up of that thread (a thread's own /proc/<pid>/status counts only itself)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def idle_by_kind(pid: int, seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """Over `seconds` of idling: percent of one core and wake-ups (context switches of all
    threads) per second, each per kind of process and in total."""
    procs = tree(pid)
    kinds = {p.pid: kind_of(p) for p in procs}
    cpu0 = {p.pid: cpu_seconds([p]) for p in procs}
    sw0 = {p.pid: _switches(p.pid) for p in procs}
    start = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - start
    cpu: dict[str, float] = defaultdict(float)
    wakes: dict[str, float] = defaultdict(float)
    for p in procs:
        cpu[kinds[p.pid]] += 100 * max(cpu_seconds([p]) - cpu0[p.pid], 0.0) / wall  # gone: 0
        wakes[kinds[p.pid]] += max(_switches(p.pid) - sw0[p.pid], 0) / wall
    cpu["total"] = sum(v for k, v in cpu.items() if k != "total")
    wakes["total"] = sum(v for k, v in wakes.items() if k != "total")
    return dict(cpu), dict(wakes)
