"""Fusing the two halves of a search, and a relevance score an LLM can act on.

Ranking: each candidate's BM25 score divided by the best BM25 score of the query (so the
best keyword match is 1), weighted against its cosine similarity to the query:
`bm25_weight * bm25 / best_bm25 + (1 - bm25_weight) * cosine`. On the LoCoMo dev split
(bench/locomo.py) with the bundled model, recall@5 is 0.692 for BM25 alone (English
analysis), 0.473 for dense alone, 0.653 for equal-weight RRF (which lets the weak half
drag the strong one down) and 0.704 for this fusion at bm25_weight 0.7 (0.702 at 0.6 and
0.8): never worse than the better half.

Relevance: fusion scores rank well but say nothing absolute (the best hit of any query
scores high). The relevance shown for each result is a logistic model of two things that
do mean something across queries: the cosine similarity and the share of the query's
terms (analyzed: stop words out, stemmed) that the result contains,
`1 / (1 + exp(-(13.05 * cosine + 11.52 * coverage - 7.73)))`, fitted on the dev split to
tell a result from the memory the question is about (1) from one of another person's
memory (0). It reads as "how likely this result is about what was asked". The
coefficients are calibrated for the bundled model; other models' cosines sit elsewhere.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memd.indexing.analysis import terms

DEFAULT_BM25_WEIGHT = 0.7
RELEVANCE_COSINE = 13.05
RELEVANCE_COVERAGE = 11.52
RELEVANCE_BIAS = -7.73


@dataclass(frozen=True)
class Candidate:
    """One chunk from either half: its BM25 score (0 when BM25 did not return it) and
    its cosine similarity to the query."""

    key: str
    bm25: float
    cosine: float


def fuse(candidates: Sequence[Candidate], bm25_weight: float) -> list[tuple[Candidate, float]]:
    """Candidates best first with their fused score (see the module docstring)."""
    best = max((c.bm25 for c in candidates), default=0.0)
    scored = [
        (c, bm25_weight * (c.bm25 / best if best > 0 else 0.0) + (1 - bm25_weight) * c.cosine)
        for c in candidates
    ]
    scored.sort(key=lambda item: item[1], reverse=True)
    return scored


def coverage(query_terms: Sequence[str], content: str) -> float:
    """Share of the distinct query terms that occur in `content` (both analyzed)."""
    wanted = set(query_terms)
    if not wanted:
        return 0.0
    return len(wanted & _term_set(content)) / len(wanted)


@functools.lru_cache(maxsize=4096)
def _term_set(content: str) -> frozenset[str]:
    """A chunk's analyzed terms, remembered: each recall analyses 20-40 candidates' texts,
    mostly the same chunks again (~3 ms of a recall at 10k chunks, profiled)."""
    return frozenset(terms(content))


def relevance(cosine: float, covered: float) -> float:
    """The calibrated relevance in [0, 1] of a result (see the module docstring)."""
    z = RELEVANCE_COSINE * cosine + RELEVANCE_COVERAGE * covered + RELEVANCE_BIAS
    return 1.0 / (1.0 + math.exp(-z))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity (vectors from other providers need not be unit length)."""
    dot = sum(map(operator.mul, a, b))  # 3x a generator's speed, for 20 x 256 floats a search
    norm = math.sqrt(sum(map(operator.mul, a, a))) * math.sqrt(sum(map(operator.mul, b, b)))
    return dot / norm if norm else 0.0


def fused_rows(
    dense: Sequence[dict[str, Any]],
    keyword: Sequence[dict[str, Any]],
    vector: Sequence[float],
    query: str,
    limit: int,
    bm25_weight: float,
) -> list[dict[str, Any]]:
    """The best `limit` entities of both halves' hits (pymilvus `{"distance", "entity"}`),
    fused, each with its relevance as `score`. A BM25 hit the dense half did not return
    brings its `embedding`, for its cosine; it is not passed on."""
    rows: dict[str, dict[str, Any]] = {}
    found: dict[str, Candidate] = {}
    for hit in dense:
        key = hit["entity"]["chunk_hash"]
        rows[key] = hit["entity"]
        found[key] = Candidate(key, 0.0, float(hit["distance"]))
    for hit in keyword:
        entity = dict(hit["entity"])
        vec = entity.pop("embedding", None) or []
        key = entity["chunk_hash"]
        cos = found[key].cosine if key in found else cosine(vector, vec)
        rows.setdefault(key, entity)
        # Milvus Lite 3.2.2 over gRPC reports BM25 scores negated (its internal
        # smaller-is-better distance); a Milvus server reports them as they are.
        found[key] = Candidate(key, abs(float(hit["distance"])), cos)
    query_terms = terms(query)
    out = []
    for cand, _fused in fuse(list(found.values()), bm25_weight)[:limit]:
        row = rows[cand.key]
        covered = coverage(query_terms, row.get("content") or "")
        out.append({**row, "score": relevance(cand.cosine, covered)})
    return out
