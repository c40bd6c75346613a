"""Fusing the two halves of a search, and a relevance score an LLM can act on.

Ranking: each candidate's BM25 score divided by the best BM25 score of the query (so the
best keyword match is 1), weighted against its cosine similarity to the query:
`bm25_weight * bm25 / best_bm25 + (1 - bm25_weight) * cosine`. On the LoCoMo dev split
(bench/locomo.py) with the bundled model, recall@5 is 0.692 for BM25 alone (English
analysis), 0.473 for dense alone, 0.653 for equal-weight RRF (which lets the weak half
drag the strong one down) and 0.704 for this fusion at bm25_weight 0.7 (0.702 at 0.6 and
0.8): never worse than the better half.

Relevance: fusion scores rank well but say nothing absolute (the best hit of any query
scores high). The relevance shown for each result is a logistic model of `FEATURES`: the
cosine similarity, the share of the query's terms (analyzed: stop words out, stemmed)
that the result's own text contains (the conversation title its heading repeats left
out, `own_text`), its BM25 score over the query's best, and its fused score over the
best candidate's. `bench/calibrate.py` fits the weights on LoCoMo's dev split to tell
whether a candidate holds the evidence of the question (1) or not (0), other people's
questions (whose evidence is in no candidate) included: it reads as "the chance that
this exchange holds what was asked", and the share of results holding evidence in each
score bucket follows the score (docs/quality.md). The weights are fitted for the bundled
model; another model's cosines sit elsewhere: run bench/calibrate.py again.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memd.indexing import minilm
from memd.indexing.analysis import terms
from memd.indexing.query import timing
from memd.indexing.query.memo import TextMemo
from memd.markdown import parse_exchange_heading

DEFAULT_BM25_WEIGHT = 0.7
# A question that asks what would be or is likely ("Would she enjoy Vivaldi?", "What
# fields would he likely pursue?"): its answer is an inference from what was said, which
# shares fewer words with the question than a fact does, so the dense half leads
# (`[recall] inference_bm25_weight`; LoCoMo dev, open-domain @5 0.375 -> 0.451; "might"
# and "probably" lost two questions there: docs/quality.md round 6).
_INFERENCE_RE = re.compile(r"\b(?:would|likely)\b", re.IGNORECASE)
# What the relevance is computed from, and its weights (the last one is the bias).
FEATURES = ("cosine", "coverage", "bm25_share", "fused_share")
RELEVANCE = (3.368, 3.992, -0.178, 4.753, -9.786)  # bench/calibrate.py, bundled model


def asks_inference(query: str) -> bool:
    """Whether the query asks what would be or is likely, not what was said."""
    return bool(_INFERENCE_RE.search(query))


def query_weight(query: str, bm25_weight: float, inference_bm25_weight: float) -> float:
    """The `bm25_weight` a query is searched with: for a question that asks for an
    inference (`asks_inference`), `inference_bm25_weight` when that leans further to the
    dense half; BM25 alone (`bm25_weight` 1) stays alone."""
    if bm25_weight >= 1.0 or not asks_inference(query):
        return bm25_weight
    return min(bm25_weight, inference_bm25_weight)


@dataclass(frozen=True)
class Tuning:
    """How one embedding model's cosines enter the fusion and the relevance.

    `keyword_trust`: the BM25 half is weighed by the share of the query's terms its best
    hit holds, to this power (0: always fully). When a question shares no content word
    with its answer ("what can't I eat?" for "I'm allergic to peanuts"), BM25's best is
    some exchange that shares one common word, and `bm25 / best` still gives it the full
    weight, burying what the dense half found. A model whose cosine finds paraphrases
    (MiniLM: dense alone 0.92 hit@3 on bench/paraphrase.py's set, offline) needs the
    keyword half to step back then; WordLlama's cosine does not earn it (docs/quality.md).
    `relevance`: the logistic weights of `FEATURES` and the bias, fitted per model (a
    model's cosines have their own scale)."""

    keyword_trust: float
    relevance: tuple[float, ...]


WORDLLAMA = Tuning(0.0, RELEVANCE)
# Searched (docs/quality.md, round 5) on the int8 graph's features of LoCoMo dev 26 and
# 30 (own and other people's questions) and bench/paraphrase.py's set, for the most
# paraphrases found at `min_score` 0.05 while >= 80% of never-said and of other people's
# questions get nothing, LoCoMo's own questions keep what round 4's weights found, and a
# result holding the whole query stays over 0.07 even at cosine 0.2 (a bare "6543").
# The default bar is 0.055, chosen on the merged tree (docs/quality.md, "MiniLM as the
# default").
MINILM = Tuning(2.0, (4.717, 4.571, -2.948, 0.768, -5.519))
TUNINGS = {"wordllama-l2-256": WORDLLAMA, minilm.MODEL_NAME: MINILM}
# No query vector (the embedder child is down: recall by keywords alone). MiniLM's weights
# lean on the cosine: a result holding every query term would score 0.04, under the
# default min_score, and the fallback would answer nothing; WordLlama's are BM25-led (0.23).
KEYWORDS_ONLY = WORDLLAMA


def tuning(model: str) -> Tuning:
    """The tuning of a bundled model; WordLlama's for any other (its weights are the
    ones measured with a BM25-led fusion)."""
    return TUNINGS.get(model, WORDLLAMA)


@dataclass(frozen=True)
class Candidate:
    """One chunk from either half: its BM25 score (0 when BM25 did not return it) and
    its cosine similarity to the query."""

    key: str
    bm25: float
    cosine: float


def fuse(
    candidates: Sequence[Candidate],
    bm25_weight: float,
    lift: Mapping[str, float] | None = None,
    trust: float = 1.0,
) -> list[tuple[Candidate, float]]:
    """Candidates best first with their fused score (see the module docstring), plus what
    `lift` adds to some of them (memd.indexing.query.timing); the BM25 half is weighed by
    `trust` (Tuning.keyword_trust)."""
    best = max((c.bm25 for c in candidates), default=0.0)
    lift = lift or {}
    keyword = bm25_weight * trust
    scored = [
        (
            c,
            keyword * (c.bm25 / best if best > 0 else 0.0)
            + (1 - bm25_weight) * c.cosine
            + lift.get(c.key, 0.0),
        )
        for c in candidates
    ]
    scored.sort(key=lambda item: item[1], reverse=True)
    return scored


def coverage(query_terms: Sequence[str], content: str, heading: str = "") -> float:
    """Share of the distinct query terms that occur in `content` (both analyzed), the
    conversation title in an exchange's `heading` left out (see `own_text`)."""
    wanted = set(query_terms)
    if not wanted:
        return 0.0
    return len(wanted.intersection(_term_set(own_text(content, heading)))) / len(wanted)


def own_text(content: str, heading: str) -> str:
    """A chunk's text without the conversation title its exchange heading repeats.

    Every exchange heading carries its conversation's title (its first user message), so
    that a follow-up is *found* by the conversation's topic. But a title that matches the
    query then lifted every exchange of that conversation to a relevance near 1 ("spare
    key" scored an unrelated "thanks!" of the spare-key conversation 1.00): the words
    that say an exchange is about the query must be its own. The first exchange holds
    the title's words in its own text anyway."""
    parsed = parse_exchange_heading(heading) if heading else None
    if not parsed or not parsed[3]:
        return content
    first, sep, rest = content.partition("\n")
    if first.lstrip("#").strip() != heading.strip():
        return content
    return first[: len(first) - len(parsed[3])] + sep + rest


def _analyzed(content: str) -> tuple[str, ...]:
    """A chunk's distinct terms, as a tuple: a frozenset of the same 30 terms takes 2.2 KB
    (its table sized for every word of the text), the tuple 0.3 KB; `set.intersection`
    takes either."""
    return tuple(dict.fromkeys(terms(content)))


# A chunk's analyzed terms, remembered: each recall analyses 20-40 candidates' texts,
# mostly the same chunks again (~3 ms of a recall at 10k chunks, profiled). Keyed by the
# text's digest, not the text (memd.indexing.query.memo).
_term_set: TextMemo[tuple[str, ...]] = TextMemo(_analyzed, maxsize=4096)


def relevance(features: Sequence[float], weights: Sequence[float] = RELEVANCE) -> float:
    """The calibrated relevance in [0, 1] of a result from its `FEATURES` (see the
    module docstring); `weights` has one more entry than features, the bias."""
    z = sum(map(operator.mul, features, weights)) + weights[len(features)]
    return 1.0 / (1.0 + math.exp(-max(min(z, 60.0), -60.0)))


def fused_rows(
    dense: Sequence[dict[str, Any]],
    keyword: Sequence[dict[str, Any]],
    query: str,
    limit: int,
    bm25_weight: float,
    now: datetime | None = None,
    tuned: Tuning = WORDLLAMA,
) -> list[dict[str, Any]]:
    """The best `limit` entities of both halves' hits (pymilvus `{"distance", "entity"}`),
    fused, each with its relevance as `score` (`tuned`: the query's model's). A BM25 hit
    the dense half did not return brings its `cosine` to the query (`IndexClient.searches`;
    not passed on)."""
    rows: dict[str, dict[str, Any]] = {}
    found: dict[str, Candidate] = {}
    for hit in dense:
        key = hit["entity"]["chunk_hash"]
        rows[key] = hit["entity"]
        found[key] = Candidate(key, 0.0, float(hit["distance"]))
    for hit in keyword:
        entity = dict(hit["entity"])
        given = float(entity.pop("cosine", None) or 0.0)  # the index's, for a hit it sent whole
        key = entity["chunk_hash"]
        cos = found[key].cosine if key in found else given
        rows.setdefault(key, entity)
        # Milvus Lite 3.2.2 over gRPC reports BM25 scores negated (its internal
        # smaller-is-better distance); a Milvus server reports them as they are.
        found[key] = Candidate(key, abs(float(hit["distance"])), cos)
    query_terms = terms(query)
    texts = {key: _texts(row) for key, row in rows.items()}
    lift = timing.lifts(query, texts, now)
    found = {k: _own_bm25(c, query_terms, rows[k], texts[k][1]) for k, c in found.items()}
    best = max((c.bm25 for c in found.values()), default=0.0) or 1.0
    trust = 1.0
    if tuned.keyword_trust and found:
        leader = max(found.values(), key=lambda c: c.bm25)
        trust = _covered(query_terms, rows[leader.key]) ** tuned.keyword_trust
    ranked = fuse(list(found.values()), bm25_weight, lift, trust)
    top = ranked[0][1] if ranked and ranked[0][1] > 0 else 1.0
    out = []
    for cand, fused in ranked[:limit]:
        row = rows[cand.key]
        features = (cand.cosine, _covered(query_terms, row), cand.bm25 / best, fused / top)
        out.append({**row, "score": relevance(features, tuned.relevance), "features": features})
    return out


def _texts(row: Mapping[str, Any]) -> tuple[str, str]:
    """A row's heading and its own text (memd.indexing.query.timing reads both)."""
    heading = row.get("heading") or ""
    return heading, own_text(row.get("content") or "", heading)


def _own_bm25(
    cand: Candidate, query_terms: Sequence[str], row: Mapping[str, Any], own: str
) -> Candidate:
    """The candidate with its BM25 scaled by the share of the query terms it matches that
    are in its own text, not only in the conversation title its heading repeats.

    BM25 scores the indexed chunk, heading included, so a query word in a conversation's
    title matches every exchange of it alike: one conversation's exchanges then fill the
    results on the title alone. On the LoCoMo dev split this took recall@5 from 0.770 to
    0.773 (docs/quality.md, round 5); a chunk with no such title is unchanged."""
    wanted = set(query_terms)
    title = wanted.intersection(_title_terms(row))
    if cand.bm25 <= 0 or own is (row.get("content") or "") or not title:
        return cand  # every query term it holds is its own: the share is 1
    mine = wanted.intersection(_term_set(own))
    share = len(mine) / len(mine | title)  # its terms are its own text's and its title's
    return cand if share >= 1.0 else Candidate(cand.key, cand.bm25 * share, cand.cosine)


def _title_terms(row: Mapping[str, Any]) -> tuple[str, ...]:
    """The terms of the conversation title in a row's exchange heading (none without).

    `_own_bm25` analyses a candidate's own text only when the query names a word of its
    title: a chunk's terms are its own text's and its title's, so otherwise the share is
    1. Titles repeat over a conversation's exchanges (remembered once each), while
    analysing every candidate's text was a third of a recall at 10k chunks with 60
    candidates a half (py-spy, docs/performance.md, "Recall latency, round 8"); its own
    text is the one `coverage` analyses too, so the whole text is never analysed."""
    parsed = parse_exchange_heading(row.get("heading") or "")
    return _term_set(parsed[3]) if parsed and parsed[3] else ()


def _covered(query_terms: Sequence[str], row: Mapping[str, Any]) -> float:
    return coverage(query_terms, row.get("content") or "", row.get("heading") or "")
