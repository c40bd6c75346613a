"""What a sentence model is given of a chunk: its text without memd's own lines
(memd.markdown.bare_text), on the forms memd writes (docs/transcripts.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from memd.markdown import Part, bare_text, exchange_block
from memd.markdown.overflow import mark
from memd.markdown.transcript import conversation_header, front_matter

WHEN = datetime(2024, 3, 1, 9, 3, tzinfo=UTC)


def test_an_exchange_loses_its_heading_and_labels_but_keeps_every_word_said() -> None:
    parts = [Part("User", "I'm allergic to peanuts."), Part("Assistant", "Noted.")]
    block = exchange_block(4, WHEN, parts, note="regenerated reply to exchange 2", title="Kettle")
    assert block.startswith("## 2024-03-01 09:03:00 UTC · exchange 4")
    assert bare_text(block) == "I'm allergic to peanuts.\n\nNoted."


def test_front_matter_and_the_conversation_header_go() -> None:
    text = (
        front_matter("gw", "2024-03-01T09-03-00Z-3f9a", WHEN.timestamp())
        + conversation_header(1, WHEN)
        + exchange_block(1, WHEN, [Part("User", "My sister lives in Montreal.")])
    )
    assert bare_text(text) == "My sister lives in Montreal."


def test_tool_labels_and_the_overflow_marker_go_escaped_lines_come_back() -> None:
    text = (
        "**Tool call (lookup · call_1):** {}\n\n"
        "**User:** first half\n" + mark(2_097_152) + "\n\\# not a heading\n"
        "\\**User:** quoted\n"
    )
    assert bare_text(text) == "{}\n\nfirst half\n# not a heading\n**User:** quoted"


def test_a_summary_heading_keeps_its_topic_not_its_time_range() -> None:
    span = "2024-03-01 09:03:00 UTC – 2024-03-01 10:00:00 UTC"
    text = f"# {span} · session summary\n\n## {span} · summary · Allergies\n\n- peanuts"
    assert bare_text(text) == "Allergies\n\n- peanuts"


def test_text_that_is_only_memd_s_lines_is_kept_as_it_was() -> None:
    """A bare heading still needs a direction; queries pass through unchanged."""
    only = "## 2024-03-01 09:03:00 UTC · exchange 1"
    assert bare_text(only) == only
    assert bare_text("what can't I eat?") == "what can't I eat?"
