"""Paraphrases through the real daemon: facts said one way, asked another way.

    .venv/bin/python bench/paraphrase.py
    .venv/bin/python bench/paraphrase.py --config 'embedding={"provider": "wordllama"}'

A user judges a memory by a few questions about what they told it. This bench records
~120 personal facts (bench/data/paraphrase_facts.txt: "I'm allergic to peanuts and
shellfish.") among ~200 exchanges that hold none of them (paraphrase_distractors.txt),
in sessions of eight, through `memory.record_exchange`, waits until the index holds every
chunk, and then asks through `memory.recall` (top_k 3):

- each fact's paraphrase: the same thing asked with no content word in common with its
  exchange ("what can't I eat?"); checked at load with memd's own BM25 analysis (stop
  words out, stemmed), so keyword search cannot find them by construction;
- each fact's control question, which shares words with it ("am I allergic to peanuts?");
- questions about things never said (paraphrase_never_said.txt).

A question is a hit when one of the three results holds its fact's exchange. It prints
hit@3 and the share answered "No relevant memories found." for memd's config as started,
then, on the same index (the config edited in place: [recall] is applied live), for BM25
alone (bm25_weight 1), the dense half alone (bm25_weight 0), the relevance bar removed
(min_score 0) and both; abstention on never-said questions; how long the recorded
exchanges took until recallable (exchanges/s) and the daemon's CPU meanwhile (it embeds
for the watchers); and the daemon's resident memory. Figures: docs/indexing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from _daemon import (
    Connections,
    IndexView,
    machine,
    record_burst,
    running_daemon,
    wait_indexed,
    wait_searchable,
)

from memd.indexing.analysis import terms
from tests.support.daemon import DaemonProcess, write_config

DATA = Path(__file__).resolve().parent / "data"
CLIENT = "para"
NO_RESULTS = "No relevant memories found."
TOP_K = 3
SESSION_SIZE = 8
SEED = 25
ACKS = (
    "Noted.",
    "Got it.",
    "Okay, noted.",
    "Understood.",
)
# The recall settings compared on one index: label -> [recall] keys.
VARIANTS: dict[str, dict[str, float]] = {
    "BM25 alone": {"bm25_weight": 1.0},
    "dense alone": {"bm25_weight": 0.0},
    "no relevance bar": {"min_score": 0.0, "drop_below": 0.0},
    "dense alone, no bar": {"bm25_weight": 0.0, "min_score": 0.0, "drop_below": 0.0},
}


@dataclass(frozen=True)
class Fact:
    said: str
    asked: str
    control: str


def _lines(name: str) -> list[list[str]]:
    text = (DATA / name).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [[part.strip() for part in row.split(" | ")] for row in rows]


def load() -> tuple[list[Fact], list[tuple[str, str]], list[str]]:
    """The three files, checked: a paraphrase shares no analyzed term with its exchange
    (the acknowledgements included), a control question shares at least one."""
    facts = [Fact(*row) for row in _lines("paraphrase_facts.txt")]
    distractors = [(row[0], row[1]) for row in _lines("paraphrase_distractors.txt")]
    never = [row[0] for row in _lines("paraphrase_never_said.txt")]
    ack_terms = {t for ack in ACKS for t in terms(ack)}
    bad = []
    for fact in facts:
        said = set(terms(fact.said)) | ack_terms
        if said & set(terms(fact.asked)):
            bad.append(f"paraphrase shares {sorted(said & set(terms(fact.asked)))}: {fact.asked}")
        if not said & set(terms(fact.control)):
            bad.append(f"control shares nothing: {fact.control}")
    if bad:
        sys.exit("bad data:\n  " + "\n  ".join(bad))
    return facts, distractors, never


def sessions(facts: Sequence[Fact], distractors: Sequence[tuple[str, str]]) -> list[list[dict]]:
    """Facts and distractors shuffled (fixed seed) into sessions of SESSION_SIZE, an hour
    apart, so facts sit in ordinary conversations among unrelated exchanges."""
    rng = random.Random(SEED)
    pairs = [(f.said, rng.choice(ACKS)) for f in facts] + list(distractors)
    rng.shuffle(pairs)
    start = datetime(2024, 3, 1, 9, 0)
    out = []
    for n in range(0, len(pairs), SESSION_SIZE):
        when = start + timedelta(hours=n)
        out.append(
            [
                {
                    "conversation_id": f"chat_{n // SESSION_SIZE}",
                    "user": user,
                    "assistant": assistant,
                    "timestamp": (when + timedelta(minutes=i)).isoformat(),
                }
                for i, (user, assistant) in enumerate(pairs[n : n + SESSION_SIZE])
            ]
        )
    return out


def normalise(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


@dataclass
class Score:
    hits: list[bool]
    empty: list[bool]

    def line(self) -> str:
        n = len(self.hits)
        return f"{sum(self.hits) / n:.3f} | {sum(self.empty) / n:.1%}"


def ask(conns: Connections, questions: Sequence[str], wanted: Sequence[str | None]) -> Score:
    """hit: a result holds the wanted fact; empty: the answer was NO_RESULTS."""
    hits, empty = [], []
    for query, fact in zip(questions, wanted, strict=True):
        found = conns.call("memory.recall", {"client_id": CLIENT, "query": query, "top_k": TOP_K})
        contents = [normalise(r["content"]) for r in found["results"]]
        hits.append(fact is not None and any(normalise(fact) in c for c in contents))
        empty.append(found["text"].strip() == NO_RESULTS)
    return Score(hits, empty)


def evaluate(conns: Connections, facts: Sequence[Fact], never: Sequence[str]) -> dict[str, Score]:
    said = [f.said for f in facts]
    return {
        "paraphrase": ask(conns, [f.asked for f in facts], said),
        "control": ask(conns, [f.control for f in facts], said),
        "never said": ask(conns, never, [None] * len(never)),
    }


def apply_recall(memd: DaemonProcess, base: dict[str, Any], recall: dict[str, float]) -> None:
    """Edit the config in place and wait for memd to log that it applied it."""
    before = _applied(memd)
    data = {**base, "recall": {**base.get("recall", {}), **recall}}
    write_config(memd.config_path, data)
    deadline = time.monotonic() + 180  # a loaded machine reloads slowly
    while _applied(memd) == before:
        if time.monotonic() > deadline:
            sys.exit(f"memd did not apply recall={recall} within 180 s (see {memd.log_path})")
        time.sleep(0.1)


def _applied(memd: DaemonProcess) -> int:
    try:
        return memd.log_path.read_text(errors="replace").count("config.applied")
    except FileNotFoundError:
        return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (the daemon embeds for its watchers)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def report(results: dict[str, dict[str, Score]]) -> None:
    print(
        "| recall settings | paraphrase hit@3 | paraphrase: no results | control hit@3 "
        "| never said: no results |"
    )
    print("| --- | --- | --- | --- | --- |")
    for label, scores in results.items():
        p, c, n = scores["paraphrase"], scores["control"], scores["never said"]
        print(
            f"| {label} | {p.line()} | {sum(c.hits) / len(c.hits):.3f} "
            f"| {sum(n.empty) / len(n.empty):.1%} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra memd config (top-level key = JSON value), e.g. "
        '\'embedding={"provider": "wordllama"}\'; may be repeated',
    )
    ap.add_argument("--json", help="append the figures as one JSON line here")
    args = ap.parse_args()
    facts, distractors, never = load()
    extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.config)}
    print(machine())
    plan = sessions(facts, distractors)
    exchanges = sum(len(s) for s in plan)
    print(
        f"{len(facts)} facts among {len(distractors)} distractors ({exchanges} exchanges, "
        f"{len(plan)} sessions), {len(never)} never-said questions; config {extra or '{}'}"
    )
    clients = {CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}}
    with running_daemon(clients=clients, **extra) as memd:
        base = json.loads(json.dumps({"clients": clients, **extra}))
        base.update(_paths(memd))
        conns = Connections(memd)
        wait_searchable(memd, CLIENT)
        pid = memd.proc.pid if memd.proc else os.getpid()
        start, cpu = time.monotonic(), cpu_seconds(pid)
        record_burst(conns, CLIENT, plan, threads=4)
        chunks, _, _ = wait_indexed(memd, IndexView.of(memd, CLIENT), CLIENT, progress=False)
        seconds, cpu = time.monotonic() - start, cpu_seconds(pid) - cpu
        results = {"memd as configured": evaluate(conns, facts, never)}
        rss = rss_mib(pid)
        for label, recall in VARIANTS.items():
            apply_recall(memd, base, recall)
            results[label] = evaluate(conns, facts, never)
        conns.close()
    print(
        f"\n{exchanges} exchanges ({chunks} chunks) recorded and recallable in {seconds:.1f} s: "
        f"{exchanges / seconds:.1f} exchanges/s; the daemon's CPU meanwhile {cpu:.1f} s "
        f"({1000 * cpu / exchanges:.0f} ms an exchange)"
    )
    print(
        f"daemon memory after indexing and the first questions: RSS {rss[0]:.0f} MiB "
        f"(peak {rss[1]:.0f} MiB)\n"
    )
    report(results)
    print(f"\nat the end: {machine()}")
    if args.json:
        figures = {
            label: {k: sum(s.hits) / len(s.hits) for k, s in scores.items()}
            for label, scores in results.items()
        }
        line = {
            "config": extra,
            "exchanges_per_s": exchanges / seconds,
            "daemon_cpu_s": cpu,
            "rss_mib": rss[0],
            "hit@3": figures,
        }
        with open(args.json, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def _paths(memd: DaemonProcess) -> dict[str, Any]:
    """memory_dir and socket as the running config has them (the base of every edit)."""
    import tomllib

    data = tomllib.loads(memd.config_path.read_text(encoding="utf-8"))
    return {k: data[k] for k in ("memory_dir", "socket") if k in data}


if __name__ == "__main__":
    main()
