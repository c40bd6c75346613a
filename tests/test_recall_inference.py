"""A question that asks what would be or is likely leans on the dense half.

"Would Caroline enjoy Vivaldi?" is answered by what she said about music she plays, not by
an exchange that repeats the question's words: the answer is an inference, and such
questions share fewer words with their evidence than questions about a stated fact. On
LoCoMo's dev split the open-domain questions (28 of 44 say "would" or "likely") went from
0.375 to 0.451 recall@5 when searched with `[recall] inference_bm25_weight` 0.4 instead
of `bm25_weight` 0.7, with no other question changed (docs/quality.md, round 6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memd.config import ConfigError, RecallConfig, load_config
from memd.indexing.query import ranking

INFERENCE = "Would she enjoy going to a classical music concert?"
FACT = "**User:** I play the clarinet in the town orchestra.\n\n**Assistant:** Lovely!"
ECHO = "**User:** The concert last night had loud music, did you enjoy it?\n\n**Assistant:** No."


def _halves() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The dense half finds the clarinet (cosine 0.7); BM25 finds only the exchange that
    repeats three of the question's four terms (cosine 0.2)."""
    fact = {"chunk_hash": "fact", "content": FACT, "heading": "", "source": "s.md"}
    echo = {"chunk_hash": "echo", "content": ECHO, "heading": "", "source": "s.md"}
    dense = [{"distance": 0.7, "entity": fact}, {"distance": 0.2, "entity": echo}]
    keyword = [{"distance": 5.0, "entity": {**echo, "cosine": 0.2}}]
    return dense, keyword


def _first(weight: float) -> str:
    dense, keyword = _halves()
    rows = ranking.fused_rows(dense, keyword, INFERENCE, 2, weight, tuned=ranking.MINILM)
    return str(rows[0]["chunk_hash"])


def test_an_inference_question_ranks_what_the_dense_half_found_first() -> None:
    defaults = RecallConfig()
    weight = ranking.query_weight(INFERENCE, defaults.bm25_weight, defaults.inference_bm25_weight)
    assert weight == defaults.inference_bm25_weight == 0.4
    assert _first(weight) == "fact"
    assert _first(defaults.bm25_weight) == "echo"  # what the plain weight put first


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Would Melanie likely enjoy the song by Vivaldi?", 0.4),
        ("What fields would Caroline be likely to pursue?", 0.4),
        ("Is it likely that John is patriotic?", 0.4),
        ("What did Melanie paint last week?", 0.7),  # a fact: the plain weight
        ("When did she go camping?", 0.7),
        ("How likelihood ratios work", 0.7),  # whole words only
    ],
)
def test_which_questions_ask_for_an_inference(query: str, expected: float) -> None:
    assert ranking.query_weight(query, 0.7, 0.4) == expected


def test_the_inference_weight_only_leans_further_to_the_dense_half() -> None:
    assert ranking.query_weight(INFERENCE, 1.0, 0.4) == 1.0  # BM25 alone stays alone
    assert ranking.query_weight(INFERENCE, 0.0, 0.4) == 0.0  # dense alone stays dense
    assert ranking.query_weight(INFERENCE, 0.3, 0.4) == 0.3
    assert ranking.query_weight(INFERENCE, 0.7, 0.7) == 0.7  # equal to bm25_weight: off


def test_inference_bm25_weight_is_a_recall_setting(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[recall]\ninference_bm25_weight = 0.5\n", encoding="utf-8")
    assert load_config(path).recall.inference_bm25_weight == 0.5
    path.write_text("[recall]\ninference_bm25_weight = 1.5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="inference_bm25_weight"):
        load_config(path)
