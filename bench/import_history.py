"""Import throughput of a synthetic ChatGPT export, and what it costs in memory.

Writes a ChatGPT `conversations.json` in the export's shape (tests.support.exports) of
`--mb` megabytes and a small one (`--small-mb`) as the same run's baseline, imports each
into its own client of a real `memd run` with `memd import`, and prints exchanges/s and
the peak RSS of memd (sampled) and of the CLI (its rusage). Goal: both RSS figures bounded,
the same for the big file as for the small one (the export is streamed, not loaded).

    .venv/bin/python bench/import_history.py [--mb 100] [--small-mb 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._daemon import running_daemon
from tests.support.exports import ChatGPTConversation

WORDS = [
    "tram",
    "harbour",
    "azulejo",
    "sourdough",
    "museum",
    "bicycle",
    "lantern",
    "orchard",
    "violin",
    "granite",
]
EXCHANGES_PER_CONVERSATION = 6


def write_export(path: Path, mb: float, seed: int) -> int:
    """A `conversations.json` of about `mb` MB, written one conversation at a time."""
    rng, exchanges, n = random.Random(seed), 0, 0
    with path.open("w", encoding="utf-8") as f:
        f.write("[")
        while f.tell() < mb * 1e6:
            n += 1
            conv = ChatGPTConversation(f"Synthetic {n}", "2024-01-01T00:00:00Z")
            for i in range(EXCHANGES_PER_CONVERSATION):
                when = f"2024-01-{1 + n % 28:02d}T{i:02d}:00:00Z"
                conv.say("user", [" ".join(rng.choices(WORDS, k=60))], when)
                conv.say("assistant", [" ".join(rng.choices(WORDS, k=240))], when)
                exchanges += 1
            f.write(("," if n > 1 else "") + json.dumps(conv.export()))
        f.write("]")
    return exchanges


def peak_rss(pid: int, stop: threading.Event, out: list[int]) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        out.append(proc.memory_info().rss)
        stop.wait(0.2)


def run_import(memd_pid: int, config: Path, client: str, export: Path) -> dict[str, float]:
    samples: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=peak_rss, args=(memd_pid, stop, samples), daemon=True)
    sampler.start()
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "memd.cli", "import", client, str(export), "--json"]
    child = subprocess.Popen(
        [*cmd, "--config", str(config)], stdout=subprocess.PIPE, env=os.environ.copy()
    )
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    summary = json.loads(out)
    assert status == 0, (status, summary)
    return {
        "exchanges": summary["imported"],
        "seconds": elapsed,
        "per_s": summary["imported"] / elapsed,
        "memd_rss_mb": max(samples) / 1e6,
        "cli_rss_mb": usage.ru_maxrss / 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--small-mb", type=float, default=10.0)
    args = parser.parse_args()
    on = {"memory_enabled": True, "mode": "both"}
    with tempfile.TemporaryDirectory(prefix="memd-bench-import-") as tmp:
        small, big = Path(tmp) / "small.json", Path(tmp) / "big.json"
        n_small = write_export(small, args.small_mb, 1)
        n_big = write_export(big, args.mb, 2)
        with running_daemon(clients={"small": on, "big": on}) as memd:
            assert memd.proc is not None
            rows = []
            for client, path, n in (("small", small, n_small), ("big", big, n_big)):
                result = run_import(memd.proc.pid, memd.config_path, client, path)
                assert result["exchanges"] == n, (result, n)
                rows.append((client, path.stat().st_size / 1e6, result))
    print(
        f"{'export':>8} {'MB':>7} {'exchanges':>10} {'s':>8} {'exch/s':>8} "
        f"{'memd RSS MB':>12} {'CLI RSS MB':>11}"
    )
    for client, mb, r in rows:
        print(
            f"{client:>8} {mb:7.1f} {r['exchanges']:10.0f} {r['seconds']:8.1f} "
            f"{r['per_s']:8.0f} {r['memd_rss_mb']:12.0f} {r['cli_rss_mb']:11.0f}"
        )


if __name__ == "__main__":
    main()
