"""More evidence per character (issue 25, round 5): the exchanges around the best results
shown inside them within `[recall] context_chars`, no heading line that repeats the label,
and a query word found only in a conversation's title not weighed as the exchange's own.

Transcripts are written in memd's format by hand and hits built as the searcher returns
them (as in tests/test_recall_shown.py); the fusion gets rows as the index returns them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memd import recall as rc
from memd.config import ConfigError, RecallConfig, load_config
from memd.indexing.query import ranking
from memd.indexing.query.search import Hit
from memd.layout import ClientLayout
from memd.recall.shown import headless

SESSION = "2026-11-01T10-00-00Z-cd34"
TITLE = "Planning the garden"


def _exchange(minute: int, number: int, user: str, assistant: str) -> str:
    return (
        f"## 2026-11-01 10:{minute:02d}:00 UTC · exchange {number} — {TITLE}\n\n"
        f"**User:** {user}\n\n**Assistant:** {assistant}\n"
    )


TRANSCRIPT = (
    f"---\nclient_id: alice\nsession_id: {SESSION}\nstarted: 2026-11-01T10:00:00Z\n---\n\n"
    "# Conversation 1 (2026-11-01 10:00:00 UTC)\n\n"
    + _exchange(0, 1, TITLE, "Happy to help.")
    + "\n"
    + _exchange(1, 2, "The tomatoes went in the south bed.", "Good sun there.")
    + "\n"
    + _exchange(2, 3, "My sister Ana gave me the seeds.", "How kind of her.")
    + "\n"
    + _exchange(3, 4, "Next year: beans.", "Noted.")
    + "\n# Conversation 2 (2026-11-01 11:00:00 UTC)\n\n"
    + "## 2026-11-01 11:00:00 UTC · exchange 1 — Other things\n\n"
    + "**User:** Other things\n\n**Assistant:** Sure.\n"
)


@pytest.fixture
def transcript(tmp_path: Path) -> tuple[ClientLayout, Path]:
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    path = layout.sessions / f"{SESSION}.md"
    path.write_text(TRANSCRIPT, encoding="utf-8")
    return layout, path


def _hit(path: Path, prefix: str, chunk: str) -> Hit:
    lines = path.read_text(encoding="utf-8").split("\n")
    start = next(i for i, line in enumerate(lines, 1) if line.startswith(prefix))
    end = next(
        (i for i, line in enumerate(lines[start:], start + 1) if line.startswith("#")),
        len(lines) + 1,
    )
    heading = lines[start - 1].lstrip("#").strip()
    when = datetime.fromisoformat(prefix[3:].replace(" ", "T") + "+00:00")
    return Hit(
        chunk,
        str(path),
        heading,
        2,
        "\n".join(lines[start - 1 : end - 1]),
        0.9,
        start,
        end - 1,
        when,
    )


EX2, EX3, EX4 = "## 2026-11-01 10:01:00", "## 2026-11-01 10:02:00", "## 2026-11-01 10:03:00"
OTHER = "## 2026-11-01 11:00:00"


def test_the_exchanges_around_a_result_are_shown_inside_it(
    transcript: tuple[ClientLayout, Path],
) -> None:
    """The evidence for "who gave me the tomato seeds?" is the exchange after the one
    found, which asks nothing (no follow-up): it is shown, and the one before too."""
    layout, path = transcript
    target = RecallConfig().context_chars
    [memory] = rc.collect([_hit(path, EX2, "ex2")], layout, 5, context_chars=target)
    assert memory.content.startswith("**User:** The tomatoes went in the south bed.")
    assert "**Next exchange:** **User:** My sister Ana gave me the seeds." in memory.content
    assert f"**Previous exchange:** **User:** {TITLE}" in memory.content
    [plain] = rc.collect([_hit(path, EX2, "ex2")], layout, 5, context_chars=0)
    assert "Ana" not in plain.content and "Previous" not in plain.content


def test_the_surrounding_exchanges_stay_within_the_budget(
    transcript: tuple[ClientLayout, Path],
) -> None:
    layout, path = transcript
    [plain] = rc.collect([_hit(path, EX2, "ex2")], layout, 5)
    [tight] = rc.collect([_hit(path, EX2, "ex2")], layout, 5, context_chars=len(plain.content) + 20)
    assert tight.content == plain.content  # the next exchange would not fit: nothing added


def test_nothing_is_shown_twice_nor_across_conversations(
    transcript: tuple[ClientLayout, Path],
) -> None:
    """Results 3 and 2: 3's neighbours are 4 and 2 (a result itself), 2's is 1. The first
    exchange of conversation 2 has no previous exchange in conversation 1."""
    layout, path = transcript
    hits = [_hit(path, EX3, "ex3"), _hit(path, EX2, "ex2"), _hit(path, OTHER, "other")]
    out = rc.collect(hits, layout, 5, context_chars=5000)
    text = "\n".join(m.content for m in out)
    for said in ("Ana gave me", "south bed", "beans", "Happy to help", "Other things"):
        assert text.count(said) == 1, said
    assert "Previous exchange" not in out[2].content


def test_no_surrounding_exchange_outside_the_recalls_period(
    transcript: tuple[ClientLayout, Path],
) -> None:
    layout, path = transcript
    after = datetime(2026, 11, 1, 10, 1, tzinfo=UTC)
    [memory] = rc.collect(
        [_hit(path, EX2, "ex2")], layout, 5, context_chars=5000, period=(after, None)
    )
    assert "Ana gave me" in memory.content and "Previous exchange" not in memory.content


def test_the_heading_line_goes_unless_it_carries_a_note() -> None:
    heading = "2026-11-01 10:01:00 UTC · exchange 2 — " + TITLE
    text, dropped = headless(f"## {heading}\n\n**User:** hi", heading)
    assert (text, dropped) == ("**User:** hi", 2)
    noted = "2026-11-01 10:01:00 UTC · exchange 3 · regenerated reply to exchange 2"
    assert headless(f"## {noted}\n\n**User:** hi", noted) == (f"## {noted}\n\n**User:** hi", 0)


def test_context_chars_is_a_recall_setting(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[recall]\ncontext_chars = 0\n", encoding="utf-8")
    assert load_config(path).recall.context_chars == 0
    path.write_text("[recall]\ncontext_chars = -1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="context_chars"):
        load_config(path)


# -- the fusion: a title's words are not the exchange's own -----------------------------------


def _row(key: str, heading: str, body: str, bm25: float) -> dict[str, Any]:
    content = f"## {heading}\n\n{body}"
    entity = {"chunk_hash": key, "content": content, "heading": heading, "source": "s.md"}
    return {"distance": bm25, "entity": {**entity, "cosine": 1.0}}


def test_a_match_in_the_conversation_title_alone_ranks_under_an_own_match() -> None:
    """BM25 scores the chunk with its heading, which repeats the conversation's title: an
    exchange of the "tomato" conversation that says nothing of tomatoes scores as high as
    one of another conversation that does. The fusion weighs only the exchange's own
    words, so the latter comes first."""
    titled = "2026-11-01 10:05:00 UTC · exchange 5 — Tomato plans"
    other = "2026-11-02 10:00:00 UTC · exchange 2 — Weekend"
    keyword = [
        _row("title-only", titled, "**User:** See you tomorrow.\n\n**Assistant:** Bye.", 5.0),
        _row("own", other, "**User:** My tomato plants\n\n**Assistant:** Nice.", 5.0),
    ]
    rows = ranking.fused_rows([], keyword, "tomato", 2, 0.7)
    assert [r["chunk_hash"] for r in rows] == ["own", "title-only"]
    assert rows[1]["features"][2] == 0.0  # its BM25 share: none of it was its own


def test_no_follow_up_outside_the_recalls_period(tmp_path: Path) -> None:
    """A result that asks a question is followed by the next user message, unless that
    message was said after the recall's `before`: a filtered recall shows nothing else."""
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    path = layout.sessions / f"{SESSION}.md"
    path.write_text(
        TRANSCRIPT.replace("Good sun there.", "Good sun there. Who gave you the seeds?"),
        encoding="utf-8",
    )
    hit = _hit(path, EX2, "ex2")
    [shown] = rc.collect([hit], layout, 5)
    assert "Ana gave me" in shown.content  # the follow-up, when nothing filters
    before = datetime(2026, 11, 1, 10, 1, 30, tzinfo=UTC)
    [memory] = rc.collect([hit], layout, 5, period=(None, before))
    assert "Ana gave me" not in memory.content
