"""The indexing size policy: a giant message is kept whole but indexed only in part.

memsearch's own chunker runs over `index_view` of real transcript text, the way memd's
`memsearch watch` does (memd.indexing.children.memsearch_watch).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from memsearch.chunker import chunk_markdown

from memd.markdown import index_view, transcript
from memd.markdown.overflow import mark
from memd.markdown.transcript import Part

WHEN = datetime(2026, 11, 30, 2, 41, 7, tzinfo=UTC)
TRICKY = (
    "The harbour ferry timetable changes in April.\n"
    + "lorem ipsum dolor sit amet " * 2000
    + f"\n## not a heading\n{mark(5)}\n**User:** not a part\n---\n"
    + "The lighthouse keeper is called Morwenna."
)


def _file(parts: list[Part], index_chars: int | None) -> str:
    return (
        transcript.front_matter("agent", "2026-11-30T02-41-07Z-3f9a", WHEN.timestamp())
        + transcript.conversation_header(1, WHEN)
        + transcript.exchange_block(1, WHEN, parts, title="ferry", index_chars=index_chars)
        + transcript.exchange_block(
            2, WHEN, [Part("User", "front door?"), Part("Assistant", "Teal.")], index_chars=8192
        )
    )


def _indexed(text: str) -> str:
    return "\n".join(c.content for c in chunk_markdown(index_view(text)))


@pytest.mark.parametrize("room", [None, 1, 4096, 40_000, 10**9])
def test_every_message_reads_back_exactly_whatever_the_limit(room: int | None) -> None:
    parts = [Part("User", TRICKY), Part("Assistant", "Noted.\n" + TRICKY[::-1])]
    parsed = transcript.parse_transcript(_file(parts, room))
    exchanges = parsed.conversations[0].exchanges
    assert [p.text for p in exchanges[0].parts] == [p.text for p in parts]
    assert [p.text for p in exchanges[1].parts] == ["front door?", "Teal."]


def test_only_the_start_of_a_giant_message_is_chunked_and_lines_stay_true() -> None:
    text = _file([Part("User", TRICKY), Part("Assistant", "Noted.")], 4096)
    view = index_view(text)
    assert view.count("\n") == text.count("\n")
    assert [len(line) for line in view.split("\n") if line] == [
        len(line) for line in text.split("\n") if line and not _in_tail(line, text)
    ]
    indexed = _indexed(text)
    assert "harbour ferry" in indexed
    assert "Noted." in indexed, "every message keeps its first characters indexed"
    assert "front door?" in indexed and "Teal." in indexed, "the next exchange is indexed"
    assert "Morwenna" not in indexed
    assert "more characters of this message" not in indexed
    whole = _file([Part("User", TRICKY), Part("Assistant", "Noted.")], None)
    assert len(chunk_markdown(index_view(text))) * 5 < len(chunk_markdown(whole))


def _in_tail(line: str, text: str) -> bool:
    start = text.index("\n--- memd: ")
    end = text.index("**Assistant:** Noted.")
    at = text.index(line)
    return start < at < end


def test_without_a_limit_everything_is_indexed_and_no_marker_is_written() -> None:
    text = _file([Part("User", TRICKY), Part("Assistant", "Noted.")], None)
    assert "\n--- memd: " not in text
    assert index_view(text) == text
    assert "Morwenna" in _indexed(text)


def test_a_message_line_that_looks_like_the_marker_is_escaped() -> None:
    text = _file([Part("User", f"before\n{mark(3)}\nafter")], None)
    assert f"\n\\{mark(3)}\n" in text
    assert index_view(text) == text
    parts = transcript.parse_transcript(text).conversations[0].exchanges[0].parts
    assert parts[0].text == f"before\n{mark(3)}\nafter"


def test_the_cut_falls_on_a_word_break() -> None:
    text = "word " * 2000
    block = transcript.parts_block([Part("User", text)], 4096)
    head = block.split("\n--- memd: ")[0]
    assert head.endswith("word ")
    assert len(head) <= len("**User:** ") + 4096


def test_memsearchs_indexing_chunks_the_index_view_once_installed() -> None:
    """The watcher and the daemon's catch-up both install it, so their chunk ids agree."""
    import memsearch.core

    from memd.indexing import engine
    from memd.indexing.engine.chunking import settled_end

    engine.prepare_catch_up()
    text = _file([Part("User", TRICKY), Part("Assistant", "Noted.")], 4096)
    chunks = memsearch.core.chunk_markdown(text, source="s.md")
    assert chunks == chunk_markdown(settled_end(index_view(text)), source="s.md")
    assert not any("Morwenna" in c.content for c in chunks)
