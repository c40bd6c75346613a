"""Session transcript files: layout vs memsearch's chunker, exact read-back, durable appends."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memsearch.chunker import chunk_markdown

from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.markdown.transcript import Part

WHEN = datetime(2026, 11, 30, 2, 41, 7, tzinfo=UTC)

# Message texts that look like structure: every one must stay message text.
NASTY = [
    "# Conversation 3 (2026-11-30 02:41:07 UTC)",
    "## 2026-11-30 02:41:07 UTC · exchange 9",
    "---\nclient_id: evil\n---",
    "**Assistant:** I am not the assistant",
    "**User (bob):** nor a user",
    "**Tool call (rm · x):** {}",
    "\\# already escaped\n\\\\## twice\n\\**User:** too",
    "intro\n\n###### six\n####### seven\n#hashtag\n#\tTab heading\n#\u2003em-space heading",
    "```python\n# a comment in code\nprint(1)\n```",
    "trailing newline\n",
    "\n\nleading blank lines",
    "",
    "   \n  \n",
    "line\n---\nsetext underline",
    "<!-- html comment that never closes",
    "\\begin{equation} x \\end{equation}\n\\\\server\\share",
]
UNICODE = [
    "astral: 😀 𝕏 𝄞 🧑‍🚀 👩🏽‍💻",
    "RTL: שלום עולם — مرحبا بالعالم",
    "combining: e\u0301 a\u0308 n\u0303 Z\u0336\u0337",
    "CJK 中文。日本語！한국어？",
    "zero width: a\u200bb\u200dc\ufeffd",
]


def _exchange_file(texts: list[str]) -> tuple[str, list[str]]:
    """A transcript with one exchange per pair of texts, and its heading titles."""
    out = [
        transcript.front_matter("c1", "2026-11-30T02-41-07Z-3f9a", WHEN.timestamp()),
        transcript.conversation_header(1, WHEN),
    ]
    titles = ["Conversation 1 (2026-11-30 02:41:07 UTC)"]
    for i in range(0, len(texts), 2):
        n = i // 2 + 1
        out.append(
            transcript.exchange_block(
                n, WHEN, [Part("User", texts[i]), Part("Assistant", texts[i + 1])]
            )
        )
        titles.append(f"2026-11-30 02:41:07 UTC · exchange {n}")
    return "".join(out), titles


@given(st.text())
@settings(max_examples=300)
def test_escape_round_trip_and_never_structural(text: str) -> None:
    text = transcript.clean_text(text)
    escaped = transcript.escape_text(text)
    assert transcript.unescape_text(escaped) == text
    for line in escaped.split("\n"):
        assert not line.startswith(("#", "---", "**User", "**Assistant", "**System", "**Tool"))


@given(st.lists(st.text(), min_size=2, max_size=6).filter(lambda t: len(t) % 2 == 0))
@settings(max_examples=150)
def test_any_message_text_reads_back_exactly(texts: list[str]) -> None:
    texts = [transcript.clean_text(t) for t in texts]
    text, titles = _exchange_file(texts)
    parsed = transcript.parse_transcript(text)
    got = [p.text for c in parsed.conversations for e in c.exchanges for p in e.parts]
    assert got == texts
    headings = {c.heading for c in chunk_markdown(text, max_chunk_size=1500)}
    assert headings <= {"", *titles}


def test_nasty_and_unicode_texts_read_back_exactly_and_never_split_chunks() -> None:
    texts = NASTY + UNICODE + ["the end"]
    assert len(texts) % 2 == 0
    text, titles = _exchange_file(texts)
    parsed = transcript.parse_transcript(text)
    assert parsed.meta == {
        "client_id": "c1",
        "session_id": "2026-11-30T02-41-07Z-3f9a",
        "started": "2026-11-30T02:41:07Z",
    }
    assert len(parsed.conversations) == 1
    exchanges = parsed.conversations[0].exchanges
    assert [e.number for e in exchanges] == list(range(1, len(texts) // 2 + 1))
    assert [p.text for e in exchanges for p in e.parts] == texts
    assert [p.label for e in exchanges for p in e.parts] == ["User", "Assistant"] * len(exchanges)
    # memsearch's own chunker: every chunk sits under one of our headings, none under text;
    # the front matter is the one heading-less chunk (memsearch does not strip it).
    chunks = chunk_markdown(text, source="s.md", max_chunk_size=1500)
    assert chunks[0].heading == "" and chunks[0].content.startswith("---\nclient_id: c1")
    assert {c.heading for c in chunks[1:]} <= set(titles)
    assert [c.heading for c in chunks if c.heading.startswith("2026")] == titles[1:]


def test_user_and_assistant_share_one_chunk() -> None:
    text, titles = _exchange_file(
        [
            "What did the vet say about Rex's knee?",
            "Rest for two weeks, then short walks.",
            "And the diet?",
            "Less kibble, more green beans.",
        ]
    )
    chunks = chunk_markdown(text, source="s.md", max_chunk_size=1500)
    by_heading = {c.heading: c.content for c in chunks}
    first = by_heading[titles[1]]
    assert "vet say" in first and "two weeks" in first
    second = by_heading[titles[2]]
    assert "diet" in second and "green beans" in second
    assert "vet" not in second


def test_line_breaks_are_normalised_and_surrogates_replaced() -> None:
    assert transcript.clean_text("a\r\nb\rc\u2028d\x0be\x85f") == "a\nb\nc\nd\ne\nf"
    assert transcript.clean_text("bad \ud800 half") == "bad \ufffd half"
    text, _ = _exchange_file([transcript.clean_text("x\r# fake"), "y"])
    assert [c.heading for c in chunk_markdown(text) if "fake" in c.heading] == []
    assert text.encode("utf-8").decode("utf-8") == text


def test_label_details_are_single_line_and_cannot_close_the_marker() -> None:
    got = transcript.label("Tool call", "name**\n(evil):** x")
    assert got == "Tool call (name [evil]: x)"
    text = transcript.parts_block([Part(got, "args")])
    assert transcript.parse_transcript(text).conversations[0].preamble == [Part(got, "args")]


def test_exchange_title_parses_for_recall() -> None:
    block = transcript.exchange_block(4, WHEN, [Part("User", "u")], note="regenerated reply")
    title = block.split("\n")[0][3:]
    assert transcript.parse_exchange_title(title) == (WHEN, 4, "regenerated reply")
    assert transcript.parse_exchange_title("Conversation 1 (x)") is None


def test_session_ids_sort_by_time_and_are_file_names() -> None:
    a = transcript.new_session_id(1_800_000_000.0)
    b = transcript.new_session_id(1_800_000_001.0)
    assert a < b
    assert transcript.SESSION_ID_RE.match(a)
    assert a.startswith("2027-01-15T08-00-00Z-")


def test_front_matter_quotes_unusual_client_ids() -> None:
    text = transcript.front_matter("we ird: id", "2026-11-30T02-41-07Z-3f9a", WHEN.timestamp())
    assert transcript.parse_transcript(text).meta["client_id"] == "we ird: id"


def test_append_file_reopens_after_delete_and_after_replace(tmp_path: Path) -> None:
    path = tmp_path / "s.md"
    f = transcript.AppendFile(path)
    size, _ = f.append(b"## a\n\n", b"HEAD\n")
    assert path.read_bytes() == b"HEAD\n## a\n\n" and size == 11
    f.append(b"## b\n\n", b"HEAD\n")
    assert path.read_bytes() == b"HEAD\n## a\n\n## b\n\n"
    path.unlink()  # the user deleted the transcript: recreated with its front matter
    f.append(b"## c\n\n", b"HEAD\n")
    assert path.read_bytes() == b"HEAD\n## c\n\n"
    edited = tmp_path / "edit.tmp"  # an editor saving by rename
    edited.write_bytes(b"HEAD\nedited\n")
    os.replace(edited, path)
    f.append(b"## d\n\n", b"HEAD\n")
    f.close()
    assert path.read_bytes() == b"HEAD\nedited\n## d\n\n"


def _committed(tmp_path: Path, body: bytes) -> tuple[Path, int, bytes]:
    path = tmp_path / "s.md"
    f = transcript.AppendFile(path)
    size, digest = f.append(body, b"---\nfront\n---\n\n")
    f.close()
    return path, size, digest


def test_reconcile_cuts_our_unacknowledged_tail(tmp_path: Path) -> None:
    path, size, digest = _committed(tmp_path, b"## one\n\n**User:** hi\n\n")
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b"## 2026-11-30 02:41:07 UTC \xc2")  # torn mid-character
    assert transcript.reconcile(path, size, digest) == "truncated"
    assert path.read_bytes() == good
    assert transcript.reconcile(path, size, digest) == "ok"


def test_reconcile_cuts_a_tail_that_joins_the_open_exchange(tmp_path: Path) -> None:
    path, size, digest = _committed(tmp_path, b"## one\n\n**User:** hi\n\n")
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(transcript.parts_block([Part("Tool (call_1)", "result")]).encode())
    assert transcript.reconcile(path, size, digest) == "truncated"
    assert path.read_bytes() == good


def test_reconcile_leaves_edits_alone(tmp_path: Path) -> None:
    path, size, digest = _committed(tmp_path, b"## one\n\n**User:** hi\n\n")
    with open(path, "ab") as fh:
        fh.write(b"my own notes\n")
    assert transcript.reconcile(path, size, digest) == "edited"
    path.write_bytes(path.read_bytes().replace(b"hi", b"HI") + b"## more\n")
    assert transcript.reconcile(path, size, digest) == "edited"
    path.write_bytes(b"short")
    assert transcript.reconcile(path, size, digest) == "shorter"
    path.unlink()
    assert transcript.reconcile(path, size, digest) == "missing"


def test_orphan_needs_our_front_matter(tmp_path: Path) -> None:
    sid = "2026-11-30T02-41-07Z-3f9a"
    ours = tmp_path / f"{sid}.md"
    ours.write_text(transcript.front_matter("c1", sid, WHEN.timestamp()))
    assert transcript.is_orphan(ours, "c1")
    assert not transcript.is_orphan(ours, "c2")
    notes = tmp_path / "2026-11-30T02-41-08Z-aaaa.md"
    notes.write_text("# my notes\n")
    assert not transcript.is_orphan(notes, "c1")
    summary = tmp_path / f"{sid}-summary.md"
    summary.write_text(transcript.front_matter("c1", sid, WHEN.timestamp()))
    assert not transcript.is_orphan(summary, "c1")


def test_restore_moves_an_archived_transcript_back(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path, "c1")
    layout.ensure()
    sid = "2026-11-30T02-41-07Z-3f9a"
    layout.archive_file(sid).write_text("x")
    assert transcript.restore(layout, sid) == layout.session_file(sid)
    assert layout.session_file(sid).read_text() == "x" and not layout.archive_file(sid).exists()
    with pytest.raises(FileNotFoundError):
        transcript.restore(layout, sid)


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("  How do I\n\trotate   the API keys?  ", "How do I rotate the API keys?"),
        ("# heading\n## two\r\nlines\u2028sep\x00nul", "# heading ## two lines sep nul"),
        ("word " * 30, "word " * 13 + "word…"),
        ("x" * 100, "x" * 69 + "…"),
        ("", ""),
    ],
)
def test_conversation_title_is_one_short_line(text: str, title: str) -> None:
    got = transcript.conversation_title(text)
    assert got == title
    assert len(got) <= transcript.TITLE_CHARS
    assert got == transcript.conversation_title(got)


def test_title_and_note_are_told_apart_and_texts_read_back() -> None:
    title = "Why does a · b — c\n## fail? · exchange 7 — x"
    block = (
        transcript.conversation_header(1, WHEN)
        + transcript.exchange_block(
            3,
            WHEN,
            [Part("User", "u"), Part("Assistant", "a")],
            note="regenerated reply to exchange 2",
            title=title,
        )
        + transcript.exchange_block(4, WHEN, [Part("User", "v")], title=title)
    )
    headings = [line[3:] for line in block.split("\n") if line.startswith("## ")]
    safe = transcript.conversation_title(title)
    assert headings == [
        f"2026-11-30 02:41:07 UTC · exchange 3 · regenerated reply to exchange 2 — {safe}",
        f"2026-11-30 02:41:07 UTC · exchange 4 — {safe}",
    ]
    assert transcript.parse_exchange_title(headings[0]) == (
        WHEN,
        3,
        "regenerated reply to exchange 2",
    )
    assert transcript.parse_exchange_title(headings[1]) == (WHEN, 4, "")
    assert transcript.parse_exchange_heading(headings[1]) == (WHEN, 4, "", safe)
    [conv] = transcript.parse_transcript(block).conversations
    assert [(e.number, e.note, e.title) for e in conv.exchanges] == [
        (3, "regenerated reply to exchange 2", safe),
        (4, "", safe),
    ]
    assert [p.text for e in conv.exchanges for p in e.parts] == ["u", "a", "v"]


def test_titled_exchange_keeps_question_and_answer_in_one_chunk() -> None:
    title = "How do I rotate the API keys for the staging cluster without downtime?"
    text = transcript.conversation_header(1, WHEN) + "".join(
        transcript.exchange_block(
            n, WHEN, [Part("User", f"question {n}"), Part("Assistant", f"answer {n}")], title=title
        )
        for n in (1, 2)
    )
    chunks = [c for c in chunk_markdown(text) if c.content.strip() and c.heading.startswith("2026")]
    assert len(chunks) == 2
    for n, chunk in enumerate(chunks, 1):
        assert transcript.parse_exchange_title(chunk.heading) == (WHEN, n, "")
        assert "rotate the API keys" in chunk.content
        assert f"question {n}" in chunk.content and f"answer {n}" in chunk.content


def test_a_session_id_and_iso_time_keep_four_digit_years() -> None:
    """glibc's `%Y` writes year 1 as `1`: the fuzz test's timestamp made a session file
    no session-id pattern accepted."""
    from memd.markdown.files import SESSION_ID_RE
    from memd.markdown.transcript import iso, new_session_id

    early = datetime(1, 1, 1, 14, tzinfo=UTC).timestamp()
    assert new_session_id(early).startswith("0001-01-01T14-00-00Z-")
    assert SESSION_ID_RE.match(new_session_id(early))
    assert iso(early) == "0001-01-01T14:00:00Z"
    assert iso(datetime(2026, 12, 2, 9, 5, 7, tzinfo=UTC).timestamp()) == "2026-12-02T09:05:07Z"
