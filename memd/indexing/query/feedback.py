"""Pseudo-relevance feedback: a second keyword search with words of the first one's best.

A question that asks for a set ("What video games does Nate play?") has evidence that
shares no word with it ("the final of a big Valorant tournament"), in another session
than the exchange that does match. The best results of the first search hold the words
the conversation uses for the topic ("tournament", "gaming"); a second BM25 request with
those words beside the question's own reaches exchanges neither half ranked in its top
20 (RM3-style expansion, no LLM). The words come from the best `FROM` results' own text
(the conversation title their headings repeat left out), weighed by their frequency there
and by how rare they are in the whole candidate pool (a word in most candidates says
nothing about this topic: the pool stands in for the collection's statistics, which recall
does not have). The question's own words are repeated `QUERY_REPEAT` times in the second
request so that they still lead (BM25 counts a repeated query word again).

What the second request changes is the order of the results; each result's relevance stays
what the first search's scoring gives it, so a question the memory does not hold still
gets nothing (docs/quality.md, round 7).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from memd.indexing.analysis import STOP_WORDS, WORD_RE, stem, terms
from memd.indexing.query import ranking

FROM = 3  # the first search's best results the words are taken from
QUERY_REPEAT = 3  # the question's own words, repeated, against each feedback word once
_STOP = frozenset(STOP_WORDS)


def words(rows: Sequence[Mapping[str, Any]], query: str, count: int) -> list[str]:
    """Up to `count` words (as written, one per stem) from the best `FROM` of `rows` (a
    fused pool, best first) that are not the query's own terms, rarest in the pool first."""
    if count <= 0 or not rows:
        return []
    own = [_own(row) for row in rows]
    pool: Counter[str] = Counter()
    for text in own:
        pool.update(set(terms(text)))
    wanted = set(terms(query))
    weight: Counter[str] = Counter()
    written: dict[str, str] = {}
    for text in own[:FROM]:
        found = [(stem(w), w) for w in WORD_RE.findall(text.lower()) if w not in _STOP]
        for s, w in found:
            if s in wanted or w.isdigit():
                continue
            written.setdefault(s, w)
            weight[s] += math.log((len(rows) + 1) / (pool[s] + 0.5)) / len(found)
    return [written[s] for s, _ in weight.most_common(count)]


def expanded(query: str, feedback: Sequence[str]) -> str:
    """The second request's text: the question `QUERY_REPEAT` times, then the words."""
    return " ".join([query] * QUERY_REPEAT + list(feedback))


def _own(row: Mapping[str, Any]) -> str:
    return ranking.own_text(row.get("content") or "", row.get("heading") or "")
