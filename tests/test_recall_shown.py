"""What one recall shows: no exchange twice, no whole-conversation expansion, titles that
do not make an unrelated exchange relevant, absolute dates, and the relevance gate.

Transcripts are written in memd's format by hand (one with a system prompt under its
conversation header, as `both` mode records) and hits built as the searcher returns them.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memd import recall as rc
from memd.config import RecallConfig
from memd.indexing.analysis import terms
from memd.indexing.query import ranking
from memd.indexing.query.search import Hit
from memd.layout import ClientLayout
from memd.recall.service import relevant
from memd.sessions.tracker import ClientSessions
from tests.support.embedder import EmbedderChild
from tests.support.index import ClientIndex, client_config

SESSION = "2026-11-01T10-00-00Z-ab12"
TITLE = "Where did I put the spare key?"
TRANSCRIPT = f"""---
client_id: alice
session_id: {SESSION}
started: 2026-11-01T10:00:00Z
---

# Conversation 1 (2026-11-01 10:00:00 UTC)

**System:** You are a helpful assistant for keys and locks.

## 2026-11-01 10:00:00 UTC · exchange 1 — {TITLE}

**User:** {TITLE}

**Assistant:** Under the blue flower pot by the back door.

## 2026-11-01 10:01:00 UTC · exchange 2 — {TITLE}

**User:** Thanks! Also, what's the weather like tomorrow?

**Assistant:** Sunny and warm.

## 2026-11-01 10:02:00 UTC · exchange 3 — {TITLE}

**User:** I went to the locksmith yesterday and had a copy made last Saturday.

**Assistant:** Good idea.
"""


@pytest.fixture
def transcript(tmp_path: Path) -> tuple[ClientLayout, Path]:
    layout = ClientLayout(tmp_path / "memory", "alice")
    layout.ensure()
    path = layout.sessions / f"{SESSION}.md"
    path.write_text(TRANSCRIPT, encoding="utf-8")
    return layout, path


def _line(path: Path, prefix: str) -> int:
    lines = path.read_text(encoding="utf-8").split("\n")
    return next(i for i, line in enumerate(lines, 1) if line.startswith(prefix))


def _hit(path: Path, prefix: str, level: int, chunk: str, score: float = 0.9) -> Hit:
    lines = path.read_text(encoding="utf-8").split("\n")
    start = _line(path, prefix)
    end = next(
        (i for i, line in enumerate(lines[start:], start + 1) if line.startswith("#")),
        len(lines),
    )
    heading = lines[start - 1].lstrip("#").strip()
    return Hit(
        chunk_hash=chunk,
        source=str(path),
        heading=heading,
        heading_level=level,
        content="\n".join(lines[start - 1 : end - 1]),
        score=score,
        start_line=start,
        end_line=end - 1,
        when=datetime(2026, 11, 1, 10, 2, tzinfo=UTC) if level == 2 else None,
    )


def test_a_conversation_header_hit_never_repeats_the_exchanges_below_it(
    transcript: tuple[ClientLayout, Path],
) -> None:
    layout, path = transcript
    hits = [
        _hit(path, "## 2026-11-01 10:00:00", 2, "ex1"),
        _hit(path, "# Conversation 1", 1, "header"),  # the system prompt's chunk
        _hit(path, "## 2026-11-01 10:01:00", 2, "ex2"),
        _hit(path, "## 2026-11-01 10:00:00", 2, "ex1-again"),
    ]
    memories = rc.collect(hits, layout, 5)
    assert [m.chunk_hash for m in memories] == ["ex1", "header", "ex2"]
    header = memories[1].content
    assert "**System:** You are a helpful assistant" in header
    assert "## " not in header and "blue flower pot" not in header
    text = rc.render(memories)["text"]
    assert text.count("blue flower pot") == 1 and text.count("Sunny and warm") == 1


def test_results_leave_the_repeated_conversation_title_out(
    transcript: tuple[ClientLayout, Path],
) -> None:
    layout, path = transcript
    hits = [
        _hit(path, "## 2026-11-01 10:00:00", 2, "ex1"),
        _hit(path, "## 2026-11-01 10:01:00", 2, "ex2"),
    ]
    first, second = rc.collect(hits, layout, 5, follow_questions=False, neighbours=False)
    assert first.content.startswith(f"**User:** {TITLE}")  # its own first message says it
    assert second.content.startswith("**User:** Thanks!")
    assert TITLE not in second.content
    assert second.heading.endswith(TITLE)  # the result's heading field keeps it


def test_a_neighbouring_hit_is_shown_once_inside_its_result(
    transcript: tuple[ClientLayout, Path],
) -> None:
    """Top 1 is exchange 2; exchanges 1 and 3 matched too but did not make the top_k:
    each is shown, clipped, inside the result it borders, and nothing twice."""
    layout, path = transcript
    hits = [
        _hit(path, "## 2026-11-01 10:01:00", 2, "ex2"),
        _hit(path, "## 2026-11-01 10:02:00", 2, "ex3"),
        _hit(path, "## 2026-11-01 10:00:00", 2, "ex1"),
        _hit(path, "## 2026-11-01 10:02:00", 2, "ex3-again"),
    ]
    [memory] = rc.collect(hits, layout, 1, follow_questions=False)
    assert "**Next exchange:** **User:** I went to the locksmith yesterday" in memory.content
    assert "**Previous exchange:** **User:** Where did I put the spare key?" in memory.content
    assert memory.content.count("locksmith") == 1
    alone = rc.collect(hits, layout, 1, follow_questions=False, neighbours=False)
    assert "locksmith" not in alone[0].content and "spare key" not in alone[0].content


def test_relative_dates_said_in_a_result_are_shown_as_dates(
    transcript: tuple[ClientLayout, Path],
) -> None:
    layout, path = transcript
    [memory] = rc.collect([_hit(path, "## 2026-11-01 10:02:00", 2, "ex3")], layout, 5)
    assert memory.content.endswith(
        "(dates said: yesterday = 31 October 2026; last saturday = 31 October 2026)"
    )


def test_a_title_match_alone_does_not_make_an_exchange_relevant(
    transcript: tuple[ClientLayout, Path],
) -> None:
    """Every exchange heading repeats the title; the words that make an exchange relevant
    must be its own. Same cosine, the title-only match scores far under the real one."""
    _layout, path = transcript
    query = terms("spare key")
    own = _hit(path, "## 2026-11-01 10:00:00", 2, "ex1")
    other = _hit(path, "## 2026-11-01 10:01:00", 2, "ex2")
    assert ranking.coverage(query, own.content, own.heading) == 1.0
    assert ranking.coverage(query, other.content, other.heading) == 0.0
    weak = ranking.relevance((0.4, 0.0, 0.0, 0.5))
    strong = ranking.relevance((0.4, 1.0, 1.0, 1.0))
    assert weak < 0.1 and strong > 10 * weak


def test_the_gate_shows_nothing_its_own_score_calls_irrelevant() -> None:
    settings = RecallConfig()
    assert settings.drop_below > 0
    scored = [_scored(s) for s in (0.9, 0.4, settings.drop_below / 2, 0.0)]
    kept = relevant(scored, settings.min_score, settings.drop_below)
    assert [h.score for h in kept] == [0.9, 0.4]
    assert relevant([_scored(settings.min_score / 2)], settings.min_score, 0.0) == []


def _scored(score: float) -> Hit:
    return Hit("c", "/x.md", "h", 2, "text", score, 1, 2)


# -- against a real index ---------------------------------------------------------------------


@pytest.mark.slow
def test_spare_key_demo_each_exchange_once_and_no_title_lift(
    tmp_path: Path, embedder: EmbedderChild
) -> None:
    """The new user's demo: a conversation titled by its spare-key question, then small
    talk in the same conversation. "spare key" finds the key's exchange first, shows
    no exchange twice, nothing at 0.00, and the small talk (whose heading repeats the
    title) does not score as highly relevant."""

    exchanges = [
        ("keys", TITLE, "Under the blue flower pot by the back door.", "2026-11-01T10:00:00Z"),
        ("keys", "Thanks! What's a good pasta recipe?", "Try carbonara.", "2026-11-01T10:01:00Z"),
        ("keys", "And the weather tomorrow?", "Sunny and warm.", "2026-11-01T10:02:00Z"),
        ("other", "My bike lock code is 4711.", "Noted.", "2026-11-02T10:00:00Z"),
    ]
    config = client_config(tmp_path / "memory", "alice")
    index = ClientIndex(config, "alice", embedder.endpoint()).start()
    try:

        async def record() -> None:
            async with ClientSessions(index.layout) as sessions:
                for conv, user, assistant, stamp in exchanges:
                    await sessions.record_exchange(conv, user, assistant, stamp)

        asyncio.run(record())
        index.wait_rows(len(exchanges))
        out = asyncio.run(rc.recall(index.searcher, "spare key", 5, None, None, index.layout))
    finally:
        index.stop()
    results = out["results"]
    assert results and "blue flower pot" in results[0]["content"]
    text = out["text"]
    assert text.count("blue flower pot") == 1
    assert text.count("carbonara") <= 1 and text.count("Sunny and warm") <= 1
    assert all(r["score"] >= RecallConfig().drop_below for r in results)
    assert "relevance 0.00" not in text
    # (the first result may show the next exchange inside it: memd.recall.surround)
    small_talk = [r for r in results[1:] if r["heading"].endswith(TITLE)]
    assert all(r["score"] < results[0]["score"] / 2 for r in small_talk), results
