"""Fit recall's relevance score to what it promises, on LoCoMo's dev split.

    .venv/bin/python bench/locomo.py --reuse /tmp/locomo        # record and index once
    .venv/bin/python bench/calibrate.py --reuse /tmp/locomo     # then fit on that index

The tool's instructions say a result's relevance is "roughly the chance that the exchange
is about what you asked". This script makes that true on the one set with marked
evidence: every question (and every question asked of the *next* conversation's memory,
where nothing holds its evidence) is searched in-process with memd's own searcher
(`IndexSearcher.search`, the same fusion and features as a recall), and a logistic
regression is fitted from each candidate's features (`memd.indexing.query.ranking.FEATURES`) to
whether its text holds one of the question's evidence turns. It prints the weights for
`ranking.RELEVANCE`, the calibration of the current and the fitted weights (score bucket →
share holding evidence), and for a few `min_score` bars the share of other people's
questions answered with nothing and of own questions whose best result falls under it.

Run it again after changing the embedding model: the cosine's scale is the model's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _daemon import running_daemon, wait_searchable
from locomo import data_dir, load, normalise
from locomo_report import BUCKETS

from memd.config import load_config
from memd.indexing import IndexSearcher, index_target
from memd.indexing.query import ranking
from memd.layout import ClientLayout

TOP = 10  # candidates per question that could be shown


def gather(memd: object, convs: Sequence[object]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Features and labels of the top candidates of every question, own and cross; and
    for each question its first row (own questions first, then the cross ones)."""
    cfg = load_config(memd.config_path)  # type: ignore[attr-defined]
    searchers = {}
    for conv in convs:
        wait_searchable(memd, conv.client_id)  # type: ignore[attr-defined,arg-type]
        layout = ClientLayout(cfg.memory_dir, conv.client_id)  # type: ignore[attr-defined]
        searchers[conv.client_id] = IndexSearcher(index_target(cfg, layout), cfg.embedding)  # type: ignore[attr-defined]
    rows: list[tuple[float, ...]] = []
    labels: list[int] = []
    starts: list[int] = []
    n = len(convs)
    for shift in (0, 1):
        for i, conv in enumerate(convs):
            searcher = searchers[convs[(i + shift) % n].client_id]  # type: ignore[attr-defined]
            for q in conv.questions:  # type: ignore[attr-defined]
                starts.append(len(rows))
                for hit in searcher.search(q.text, TOP):
                    rows.append(hit.features)
                    found = normalise(hit.content)
                    labels.append(int(shift == 0 and any(e in found for e in q.evidence)))
    for s in searchers.values():
        s.close()
    return np.asarray(rows, dtype=float), np.asarray(labels, dtype=float), starts


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 50) -> np.ndarray:
    """Logistic regression by Newton's method (weights then bias)."""
    a = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(a.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-np.clip(a @ w, -60, 60)))
        grad = a.T @ (p - y) + l2 * w
        hess = (a * (p * (1 - p))[:, None]).T @ a + l2 * np.eye(a.shape[1])
        w -= np.linalg.solve(hess, grad)
    return w


def table(scores: np.ndarray, y: np.ndarray, name: str) -> None:
    print(f"\n{name}\n\n| relevance | candidates | hold evidence |\n| --- | --- | --- |")
    for lo, hi in itertools.pairwise(BUCKETS):
        inside = (scores >= lo) & (scores < hi)
        share = f"{y[inside].mean():.0%}" if inside.any() else "–"
        print(f"| {lo:.1f}–{min(hi, 1.0):.1f} | {int(inside.sum())} | {share} |")


def bars(scores: np.ndarray, starts: list[int], own: int) -> None:
    """For a few min_score bars: other people's questions answered with nothing, and own
    questions whose best candidate is under the bar (answered with nothing too)."""
    ends = [*starts[1:], len(scores)]
    spans = zip(starts, ends, strict=True)
    best = np.array([scores[a:b].max() if b > a else 0.0 for a, b in spans])
    print("\n| min_score | other people's answered with nothing | own answered with nothing |")
    print("| --- | --- | --- |")
    for bar in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
        print(f"| {bar:.2f} | {(best[own:] < bar).mean():.1%} | {(best[:own] < bar).mean():.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder with the dev conversations")
    ap.add_argument("--reuse", required=True, help="a folder bench/locomo.py --reuse indexed")
    ap.add_argument("--conversations", default="26,30,41,42,43")
    args = ap.parse_args()
    folder = data_dir(args.data)
    convs = [load(folder, name) for name in args.conversations.split(",")]
    clients = {c.client_id: {"memory_enabled": True, "mode": "mcp_via_llm"} for c in convs}
    with running_daemon(Path(args.reuse), clients=clients) as memd:
        x, y, starts = gather(memd, convs)
    own = sum(len(c.questions) for c in convs)
    print(f"{len(x)} candidates of {len(starts)} questions; features {ranking.FEATURES}")
    current = np.array([ranking.relevance(f) for f in x])
    table(current, y, f"current weights {ranking.RELEVANCE}")
    w = fit(x, y)
    fitted = 1 / (1 + np.exp(-np.clip(np.hstack([x, np.ones((len(x), 1))]) @ w, -60, 60)))
    table(fitted, y, f"fitted weights {json.dumps([round(v, 3) for v in w])}")
    bars(fitted, starts, own)


if __name__ == "__main__":
    sys.exit(main())
