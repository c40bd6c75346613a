"""What the MiniLM onnxruntime session costs in memory and speed, per session option.

    .venv/bin/python bench/ort_session.py [--rounds 2] [--variant NAME ...]

Each variant runs in a fresh interpreter (memory is per process): it imports what the
model needs, tunes the heap as memd's processes do (memd/heap.py), loads the model with
memd's session options changed by the variant, embeds the bench's texts (the paraphrase
set's lines, and joins of them long enough to reach the 128-token cut), and reports:

- RSS / PSS / USS added by creating the session, and after embedding the texts, then
  after `malloc_trim(0)` (from /proc/self/smaps_rollup);
- CPU ms per text (process time: the machine is shared, wall time is not reliable);
- whether the vectors are bit-identical to memd's own options' (sha256 of the float32s):
  a variant that changes them would rename the model (memd/indexing/minilm.py).

Variants alternate over `--rounds` so the machine's load falls on all of them alike; the
first, `memd`, is what memd ships (the baseline of the run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"

# variant -> (session config entries, SessionOptions attributes)
VARIANTS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "memd": ({}, {}),
    "arena_on": ({}, {"enable_cpu_mem_arena": True}),
    "mem_pattern_off": ({}, {"enable_mem_pattern": False}),
    "opt_disable_all": ({}, {"graph_optimization_level": "ORT_DISABLE_ALL"}),
    "opt_basic": ({}, {"graph_optimization_level": "ORT_ENABLE_BASIC"}),
    "opt_extended": ({}, {"graph_optimization_level": "ORT_ENABLE_EXTENDED"}),
    "prepacking_off": ({"session.disable_prepacking": "1"}, {}),
    "env_allocators": ({"session.use_env_allocators": "1"}, {}),
    "model_as_bytes": ({}, {"_bytes": True}),
    "no_pattern_no_prepack": ({"session.disable_prepacking": "1"}, {"enable_mem_pattern": False}),
    # an arena shared through the environment, grown by what is asked, not powers of two
    "env_arena_same": ({}, {"_env_arena": {"arena_extend_strategy": 1}}),
    "env_arena_same_nopattern": (
        {},
        {"_env_arena": {"arena_extend_strategy": 1}, "enable_mem_pattern": False},
    ),
    # glibc's own mmap threshold (memd.heap fixes it at 256 KiB): ORT's buffers reused
    "glibc_threshold": ({}, {"_glibc_threshold": True}),
}


def texts() -> list[str]:
    lines = [
        line.strip()
        for name in (
            "paraphrase_facts.txt",
            "paraphrase_distractors.txt",
            "paraphrase_never_said.txt",
        )
        for line in (DATA / name).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    joined = [" ".join(lines[i : i + 5]) for i in range(0, len(lines) - 5, 3)]
    return lines + joined


def smaps() -> dict[str, float]:
    kb: dict[str, int] = {}
    with open("/proc/self/smaps_rollup", encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                kb[parts[0][:-1]] = int(parts[1])
    uss = kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)
    return {"rss": kb["Rss"] / 1024, "pss": kb["Pss"] / 1024, "uss": uss / 1024}


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before[k], 1) for k in after}


def options_for(name: str) -> tuple[Any, bool]:
    """memd's session options changed as the variant says; whether to hand over bytes.
    Also sets up the process's heap the way memd's processes do (memd/heap.py)."""
    import onnxruntime as ort

    from memd import heap
    from memd.indexing import minilm

    entries, attrs = dict(VARIANTS[name][0]), dict(VARIANTS[name][1])
    if attrs.pop("_glibc_threshold", False):
        heap._LIBC.mallopt(heap.M_ARENA_MAX, heap.ARENAS)  # arenas only
    else:
        heap.limit_arenas()
    options = minilm.session_options()
    arena = attrs.pop("_env_arena", None)
    if arena is not None:
        info = ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        )
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(arena))
        options.add_session_config_entry("session.use_env_allocators", "1")
        options.enable_cpu_mem_arena = True
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    as_bytes = bool(attrs.pop("_bytes", False))
    for key, value in attrs.items():
        if key == "graph_optimization_level":
            value = getattr(ort.GraphOptimizationLevel, value)
        setattr(options, key, value)
    return options, as_bytes


def child(name: str) -> None:
    """One variant in this process; prints one JSON line."""
    import numpy as np
    import tokenizers  # noqa: F401 - imported before the baseline, as in memd

    from memd import heap
    from memd.indexing import minilm

    options, as_bytes = options_for(name)
    corpus = texts()
    heap.trim()
    before = smaps()
    model = minilm.load_model(options, model_as_bytes=as_bytes)
    loaded = smaps()
    model.embed(corpus[:5])  # warm-up, not timed
    cpu = time.process_time()
    vectors = np.asarray(model.embed(corpus), dtype=np.float32)
    cpu_ms = 1000 * (time.process_time() - cpu) / len(corpus)
    embedded = smaps()
    heap.trim()
    row = {
        "variant": name,
        "texts": len(corpus),
        "session": _delta(loaded, before),
        "embedded": _delta(embedded, before),
        "trimmed": _delta(smaps(), before),
        "cpu_ms": round(cpu_ms, 3),
        "sha": hashlib.sha256(vectors.tobytes()).hexdigest()[:16],
    }
    print(json.dumps(row))


def run(name: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", name], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    """Per variant, the run with the least PSS of each stage and the least CPU per text
    (the minimum is the least disturbed by the other jobs on the machine)."""
    base = results["memd"][0]["sha"]
    print(
        f"{'variant':26} session RSS/PSS/USS MB   +embedded RSS/PSS   +trim RSS/PSS   "
        "CPU ms/text  vectors"
    )
    for name, rows in results.items():
        s, e, t = (
            min(rows, key=lambda r, k=k: r[k]["pss"])[k] for k in ("session", "embedded", "trimmed")
        )
        cpu = min(r["cpu_ms"] for r in rows)
        same = "identical" if all(r["sha"] == base for r in rows) else "CHANGED"
        print(
            f"{name:26} {s['rss']:6.1f} / {s['pss']:6.1f} / {s['uss']:6.1f}   "
            f"{e['rss']:6.1f} / {e['pss']:6.1f}   {t['rss']:6.1f} / {t['pss']:6.1f}   "
            f"{cpu:8.2f}     {same}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    names = ["memd", *[v for v in (args.variant or VARIANTS) if v != "memd"]]
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(args.rounds):
        for name in names:
            results[name].append(run(name))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.rounds} rounds")
    report(results)


if __name__ == "__main__":
    main()
