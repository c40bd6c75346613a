"""The title rule of BM25 (memd.indexing.query.ranking._own_bm25): a query word that only
the conversation title in an exchange's heading holds does not count for that exchange.
It now analyses a candidate's text only when the query names a word of its title; the
result must be what the rule gave when every candidate was analysed."""

from __future__ import annotations

import pytest

from memd.indexing.analysis import terms
from memd.indexing.query import ranking
from memd.indexing.query.ranking import Candidate

TITLE = "Where is the spare key"
HEADING = f"2026-11-30 09:00:01 UTC · exchange 2 — {TITLE}"
ROWS = {
    "titled": {
        "heading": HEADING,
        "content": f"## {HEADING}\n\n**User:** thanks!\n\n"
        "**Assistant:** You're welcome, the bakery opens at seven.",
    },
    "titled, its own words too": {
        "heading": HEADING,
        "content": f"## {HEADING}\n\n**User:** the key is under the mat\n\n**Assistant:** Noted.",
    },
    "untitled": {
        "heading": "2026-11-30 09:00:01 UTC · exchange 1",
        "content": "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** the spare key? "
        "\n\n**Assistant:** Under the mat.",
    },
}


def _as_before(cand: Candidate, query: str, row: dict[str, str]) -> Candidate:
    """The rule as it was computed for every candidate (the oracle)."""
    own = ranking.own_text(row["content"], row["heading"])
    matched = set(terms(query)).intersection(terms(row["content"]))
    if not matched or cand.bm25 <= 0:
        return cand
    share = len(matched.intersection(terms(own))) / len(matched)
    return cand if share >= 1.0 else Candidate(cand.key, cand.bm25 * share, cand.cosine)


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize(
    "query", ["spare key", "when does the bakery open", "key under the mat", "chess", ""]
)
def test_the_title_rule_is_unchanged(name: str, query: str) -> None:
    row = ROWS[name]
    cand = Candidate("k", 3.0, 0.5)
    own = ranking.own_text(row["content"], row["heading"])
    assert ranking._own_bm25(cand, terms(query), row, own) == _as_before(cand, query, row)


def test_a_title_match_alone_is_scaled_down() -> None:
    """The case the rule exists for: "spare key" matches the thank-you only by its title."""
    row = ROWS["titled"]
    own = ranking.own_text(row["content"], row["heading"])
    assert ranking._own_bm25(Candidate("k", 3.0, 0.5), terms("spare key"), row, own).bm25 == 0.0
