"""Cutting exchanges out of a transcript keeps everything else byte for byte."""

from __future__ import annotations

from datetime import UTC, datetime

from memd.markdown import Part, exchange_spans, first_user_titles, remove_exchanges, transcript

T = datetime(2026, 11, 30, 2, 41, 7, tzinfo=UTC)


def sample() -> str:
    out = transcript.front_matter("c1", "2026-11-30T02-41-07Z-3f9a", T.timestamp())
    out += transcript.conversation_header(1, T)
    out += transcript.parts_block([Part("System", "be brief\n# not a header")])
    for n, q in ((1, "first q"), (2, "## tricky\n# Conversation 9 (x)")):
        out += transcript.exchange_block(
            n, T, [Part("User", q), Part("Assistant", f"a{n}")], title="first q"
        )
    out += transcript.conversation_header(2, T)
    out += transcript.exchange_block(
        1, T, [Part("User", "other"), Part("Assistant", "x")], title="other"
    )
    out += transcript.conversation_header(1, T, "continued")
    out += transcript.exchange_block(
        3, T, [Part("User", "third"), Part("Assistant", "a3")], title="first q"
    )
    return out


def test_spans_find_every_exchange_and_ignore_escaped_lookalikes() -> None:
    keys = [s.key for s in exchange_spans(sample())]
    assert keys == [(1, 1), (1, 2), (2, 1), (1, 3)]


def test_removing_exchanges_keeps_the_rest_exactly() -> None:
    text = sample()
    out, cut = remove_exchanges(text, {(1, 2)})
    assert cut == 1
    parsed = transcript.parse_transcript(out)
    before = transcript.parse_transcript(text)
    assert [c.number for c in parsed.conversations] == [1, 2, 1]
    assert parsed.conversations[0].exchanges == before.conversations[0].exchanges[:1]
    assert parsed.conversations[0].preamble == before.conversations[0].preamble
    assert parsed.conversations[1:] == before.conversations[1:]
    assert "tricky" not in out


def test_removing_a_whole_conversation_takes_its_preamble() -> None:
    out, cut = remove_exchanges(sample(), {(1, 1), (1, 2), (1, 3)})
    assert cut == 3
    assert "be brief" not in out and "first q" not in out and "third" not in out
    assert "# Conversation 1 (" in out and "other" in out
    assert transcript.parse_transcript(out).conversations[0].preamble == []


def test_nothing_matching_changes_nothing() -> None:
    text = sample()
    assert remove_exchanges(text, {(7, 7)}) == (text, 0)


def test_titles_come_from_the_first_user_message_in_the_file() -> None:
    assert first_user_titles(sample()) == {1: "first q", 2: "other"}
    out, _ = remove_exchanges(sample(), {(1, 1)})
    assert first_user_titles(out)[1] == "## tricky # Conversation 9 (x)"
