"""Pseudo-relevance feedback: words of the first search's best results order the results.

"What video games does Nate play?" has evidence that shares no word with it ("the final of
a big Valorant tournament"), in another session than the exchange that matches the
question; the matching exchange holds the word that finds it. A second BM25 request with
the rarest words of the first search's best results reaches it (LoCoMo dev, round 7 in
docs/quality.md). The relevance of every result stays what the first search gives it, so a
question the memory cannot answer still gets nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memd.config import ConfigError, RecallConfig, load_config
from memd.indexing.query import feedback, ranking
from memd.indexing.query.search import Hit, IndexSearcher
from tests.test_index_server import Child, short_dir, stopping_children
from tests.test_search import Index, exchange

QUESTION = "What video games does Nate play?"


def _row(text: str) -> dict[str, str]:
    return {"content": f"**User:** {text}\n\n**Assistant:** Nice.", "heading": ""}


def test_feedback_words_are_the_best_results_rarest_words_not_the_questions() -> None:
    rows = [  # the first search's pool, best first
        _row("Nate: I play video games with my friends, Valorant mostly."),
        _row("Nate: my friends watched me play Valorant."),
        _row("Nate: my friends play too."),
        _row("Nate: my friends went hiking."),
        _row("Nate: my friends love my turtles."),
    ]
    words = feedback.words(rows, QUESTION, 2)
    assert words[0] == "valorant"  # twice in the best three, rare in the pool
    assert "friends" not in words  # in every candidate: says nothing
    assert "hiking" not in words  # not in the best three
    assert not {"video", "games", "play", "nate"} & set(words)  # the question's own
    assert feedback.words(rows, QUESTION, 0) == []


def test_feedback_words_leave_the_conversation_title_out() -> None:
    heading = "2026-11-30 09:00:00 UTC · exchange 2 — Quarterly budget spreadsheet"
    row = {"content": f"## {heading}\n\n**User:** Nate: the Valorant final!", "heading": heading}
    words = feedback.words([row, _row("Nate: turtles")], QUESTION, 10)
    assert "valorant" in words and "budget" not in words and "spreadsheet" not in words


def test_the_question_leads_the_second_request() -> None:
    text = feedback.expanded(QUESTION, ["valorant", "tournament"])
    assert text.count(QUESTION) == feedback.QUERY_REPEAT > 1
    assert text.endswith("valorant tournament")


def test_no_feedback_for_a_question_that_asks_for_an_inference() -> None:
    assert ranking.query_feedback(QUESTION, 10) == 10
    assert ranking.query_feedback("Would Nate likely enjoy a LAN party?", 10) == 0


def test_feedback_terms_is_a_recall_setting(tmp_path: Path) -> None:
    assert RecallConfig().feedback_terms == 10
    path = tmp_path / "config.toml"
    path.write_text("[recall]\nfeedback_terms = 0\n", encoding="utf-8")
    assert load_config(path).recall.feedback_terms == 0
    path.write_text("[recall]\nfeedback_terms = 500\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="feedback_terms"):
        load_config(path)


T0 = datetime(2026, 3, 1, 18, 0, 0, tzinfo=UTC)
MATCH = ("Nate: I play video games, Valorant mostly.", "Joanna: Fun!")
EVIDENCE = ("Nate: I'm in the final of a big Valorant tournament!", "Joanna: Wow!")
DISTRACTORS = [  # closer to the question by cosine than the evidence, no word of it
    ("Nate: an esports stream!", "Joanna: Ha!"),
    ("Nate: the arcade closed.", "Joanna: Sad."),
    ("Nate: my new console!", "Joanna: Cool."),
    ("Nate: the controller arrived.", "Joanna: Nice."),
]


def _sessions(index: Index) -> None:
    days = [[MATCH, *DISTRACTORS[:2]], [*DISTRACTORS[2:], EVIDENCE]]
    for d, pairs in enumerate(days):
        start = T0 + timedelta(days=7 * d)
        body = "".join(
            exchange(i + 1, start + timedelta(minutes=5 * i), u, a)
            for i, (u, a) in enumerate(pairs)
        )
        index.write(f"s{d}.md", f"# Conversation {d + 1} ({start:%Y-%m-%d %H:%M:%S} UTC)\n\n{body}")


@pytest.fixture(scope="module")
def searcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IndexSearcher]:
    """One index server with the two sessions for the whole module."""
    children: list[Child] = []
    gen = stopping_children()
    children = next(gen)
    short = short_dir()
    sock_dir = next(short)
    index = Index(tmp_path_factory.mktemp("feedback"), sock_dir / "index.sock", children)
    _sessions(index)
    s = index.searcher()
    yield s
    s.close()
    for g in (gen, short):
        with pytest.raises(StopIteration):
            next(g)


def _rank(hits: list[Hit], text: str) -> int:
    return next(i for i, h in enumerate(hits) if text in h.content)


def test_feedback_brings_the_exchange_that_shares_only_a_found_word(
    searcher: IndexSearcher,
) -> None:
    plain = searcher.search(QUESTION, 6, bm25_weight=0.7)
    fed = searcher.search(QUESTION, 6, bm25_weight=0.7, feedback_terms=20)
    assert _rank(fed, "Valorant tournament") < _rank(plain, "Valorant tournament")
    scores = {h.chunk_hash: h.score for h in plain}
    assert all(h.score == pytest.approx(scores[h.chunk_hash]) for h in fed)  # relevance kept


def test_no_feedback_when_the_first_search_found_nothing_relevant(
    searcher: IndexSearcher,
) -> None:
    plain = searcher.search(QUESTION, 6, bm25_weight=0.7)
    floor = max(h.score for h in plain) + 0.01
    fed = searcher.search(QUESTION, 6, bm25_weight=0.7, feedback_terms=10, floor=floor)
    assert [h.chunk_hash for h in fed] == [h.chunk_hash for h in plain]
