"""The fusion keeps what the dense half alone finds, for a model whose cosine earns it.

A paraphrase shares no content word with its fact; BM25's best is then some exchange
sharing one common word, and `bm25 / best` gave it the keyword half's full weight. With
MiniLM's tuning that half is weighed by how much of the query its best hit holds.
"""

from __future__ import annotations

from typing import Any

from memd.indexing import minilm
from memd.indexing.query import ranking

QUERY = "which novel do I enjoy reading"
FACT = "**User:** My favourite sci-fi book is Dune.\n\n**Assistant:** Noted."
JUNK = "**User:** I enjoy hiking on weekends.\n\n**Assistant:** Sounds fun."


def _entity(key: str, content: str) -> dict[str, Any]:
    return {"chunk_hash": key, "content": content, "heading": "", "source": "s.md"}


def _halves(junk_cosine: float = 0.10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    dense = [
        {"distance": 0.55, "entity": _entity("fact", FACT)},
        {"distance": junk_cosine, "entity": _entity("junk", JUNK)},
    ]
    keyword = [{"distance": 4.0, "entity": {**_entity("junk", JUNK), "cosine": 0.1}}]
    return dense, keyword


def test_minilm_tuning_ranks_a_paraphrase_found_by_the_dense_half_first() -> None:
    dense, keyword = _halves()
    rows = ranking.fused_rows(dense, keyword, QUERY, 2, 0.7, tuned=ranking.MINILM)
    assert [r["chunk_hash"] for r in rows] == ["fact", "junk"]
    assert rows[0]["score"] > 0.055 > rows[1]["score"]  # over the default min_score, and not


def test_wordllama_tuning_keeps_the_keyword_led_fusion() -> None:
    dense, keyword = _halves()
    rows = ranking.fused_rows(dense, keyword, QUERY, 2, 0.7, tuned=ranking.WORDLLAMA)
    assert [r["chunk_hash"] for r in rows] == ["junk", "fact"]


def test_a_query_its_keyword_hit_answers_whole_keeps_the_keyword_half() -> None:
    """Trust is 1 when BM25's best holds every query term: the same-word question (whose
    answer MiniLM also finds near: 0.6 is a typical cosine for such a pair)."""
    dense, keyword = _halves(junk_cosine=0.6)
    query = "do I enjoy hiking"
    rows = ranking.fused_rows(dense, keyword, query, 2, 0.7, tuned=ranking.MINILM)
    assert rows[0]["chunk_hash"] == "junk"
    assert rows[0]["score"] > rows[1]["score"]


def test_the_tuning_follows_the_configured_model() -> None:
    assert ranking.tuning(minilm.MODEL_NAME) is ranking.MINILM
    assert ranking.tuning("wordllama-l2-256") is ranking.WORDLLAMA
    assert ranking.tuning("text-embedding-3-small") is ranking.WORDLLAMA


def test_minilm_keeps_a_bare_token_bm25_matches_whole_over_the_bar() -> None:
    """ "6543" for "...listens on port 6543..." has a low cosine (0.23 with MiniLM); a
    result whose own text holds the whole query, as the only candidate, still scores over
    the default `min_score` 0.055 instead of "No relevant memories found."."""
    content = "**User:** The staging database listens on port 6543.\n\n**Assistant:** Noted."
    keyword = [{"distance": 3.0, "entity": {**_entity("port", content), "cosine": 0.2}}]
    rows = ranking.fused_rows([], keyword, "6543", 1, 0.7, tuned=ranking.MINILM)
    assert rows[0]["score"] > 0.055
