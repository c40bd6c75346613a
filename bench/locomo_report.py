"""The tables `bench/locomo.py` prints: recall at the budget, per category, BM25 alone,
latency, abstention, and the calibration of the relevance score.

Calibration: every result shown at top_k 5 falls in a bucket of its relevance score; a
result holds evidence when one of its question's evidence turns appears in its content
(the same test as the recall score). The tool's instructions say the relevance is
"roughly the chance that the exchange is about what you asked": the share of results
holding evidence in each bucket should then sit near the bucket's scores. Results shown
for another person's questions (the cross-conversation run) hold no evidence by
construction and are counted in the second column.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from _daemon import percentile

NO_RESULTS = "No relevant memories found."
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def report(
    convs: Sequence[Any],
    bm25s: Sequence[tuple[Any, Any]],
    runs: dict[int, list[Any]],
    cross: list[Any],
    chunks: int,
    seconds: float,
    label: str,
    bm25_only: dict[int, list[Any]] | None = None,
    score: Callable[[Any, str], float] | None = None,
) -> dict[str, Any]:
    """Print the tables; return the headline figures (for --json)."""
    assert score is not None
    summary: dict[str, Any] = {"label": label, "questions": sum(len(c.questions) for c in convs)}
    print(
        f"\n{summary['questions']} questions, {chunks} chunks, recorded and indexed in "
        f"{seconds:.0f} s\n"
    )
    print("| served | top_k | recall | mean chars | BM25-turns baseline at that budget | gap |")
    print("| --- | --- | --- | --- | --- | --- |")
    served = {"memd": runs, **({"memd, BM25 alone": bm25_only} if bm25_only else {})}
    for name, these in served.items():
        for top_k, tallies in these.items():
            r, budget, b = _headline(tallies, bm25s, score)
            if name == "memd":
                summary[f"recall@{top_k}"], summary[f"chars@{top_k}"] = r, budget
                summary[f"baseline@{top_k}"] = b
            else:
                summary[f"bm25_only@{top_k}"] = r
                summary[f"bm25_only_chars@{top_k}"] = budget
            print(
                f"| {name} | {top_k} | {r:.3f} | {budget:,.0f} | {b:.3f} | "
                f"{100 * (r - b):+.1f} pts |"
            )
    _categories(served)
    ms = [s * 1000 for t in runs[5] for s in t.seconds]
    summary["p50_ms"], summary["p99_ms"] = percentile(ms, 50), percentile(ms, 99)
    print(
        f"\nrecall latency over the socket (top_k 5, {len(ms)} calls): "
        f"p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms"
    )
    if cross:
        texts = [c for t in cross for c in t.contents]
        share = mean([c.strip() == NO_RESULTS for c in texts])
        summary["abstention"] = share
        print(
            f"cross-conversation (questions of one conversation against the next one's "
            f"memory, top_k 5): {share:.1%} of {len(texts)} answered '{NO_RESULTS}'"
        )
    summary["calibration"] = calibration(runs[5], cross)
    return summary


def _headline(
    tallies: Sequence[Any], bm25s: Sequence[tuple[Any, Any]], score: Callable[[Any, str], float]
) -> tuple[float, float, float]:
    scores = [s for t in tallies for s in t.scores]
    budget = mean([c for t in tallies for c in t.chars])
    base = [score(q, bm.content(q.text, budget)) for conv, bm in bm25s for q in conv.questions]
    return mean(scores), budget, mean(base)


def _categories(served: dict[str, dict[int, list[Any]]]) -> None:
    names = list(served)
    head = " | ".join(f"{n} @{k}" for n in names for k in (5, 10))
    print(f"\n| category | questions | {head} |")
    print("| --- | --- |" + " --- |" * (2 * len(names)))
    for cat, name in CATEGORIES.items():
        cells = []
        count = 0
        for these in served.values():
            for k in (5, 10):
                at = [
                    s
                    for t in these[k]
                    for s, c in zip(t.scores, t.categories, strict=True)
                    if c == cat
                ]
                count = len(at)
                cells.append(f"{mean(at):.3f}")
        print(f"| {cat} {name} | {count} | " + " | ".join(cells) + " |")


def holds(question: Any, content: str) -> bool:
    """Whether one of the question's evidence turns appears in this one result."""
    found = "".join(ch for ch in content.lower() if ch.isalnum())
    return any(e in found for e in question.evidence)


def calibration(own: Sequence[Any], cross: Sequence[Any]) -> list[dict[str, Any]]:
    """Print and return, per relevance bucket, how many results fell in it and the share
    of them holding evidence (own memory; and with the other people's questions too)."""
    rows = []
    print(
        "\n| relevance | results (own memory) | hold evidence | + other people's | hold evidence |"
    )
    print("| --- | --- | --- | --- | --- |")
    for lo, hi in itertools.pairwise(BUCKETS):
        mine = [
            holds(q, r["content"])
            for t in own
            for q, results in zip(t.questions, t.results, strict=True)
            for r in results
            if lo <= r["score"] < hi
        ]
        theirs = [
            r for t in cross for results in t.results for r in results if lo <= r["score"] < hi
        ]
        both = len(mine) + len(theirs)
        share = mean(mine) if mine else math.nan
        share_all = sum(mine) / both if both else math.nan
        rows.append(
            {
                "lo": lo,
                "hi": min(hi, 1.0),
                "own": len(mine),
                "own_share": share,
                "all": both,
                "all_share": share_all,
            }
        )
        print(
            f"| {lo:.1f}–{min(hi, 1.0):.1f} | {len(mine)} | {_pct(share)} | {both} | "
            f"{_pct(share_all)} |"
        )
    return rows


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.0%}"
