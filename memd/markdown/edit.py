"""Edits of a transcript that keep its structure: find exchanges, cut some out, titles.

Used where the file, not memd's state, must have the last word: `memory.forget` cuts
exchanges out of a session file (and its archived copy), and a conversation's title is
re-derived from what the file says after a person edited it (issue #14). The scan uses
the same rules as `transcript.parse_transcript`: a line is structure only if it is a
conversation header or an exchange heading; message lines that look like either were
escaped when written, so no message text can pass for a boundary.

A cut removes whole exchanges (heading to the next heading or header), leaves every
`# Conversation N` header and every other exchange byte for byte, and keeps the numbers
as they are, so what remains still says which exchanges were there. When every exchange
of a conversation goes, its preamble (system prompt) goes with it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from memd.markdown.transcript import (
    CONV_RE,
    TITLE_SEP,
    Part,
    conversation_title,
    fsync_dir,
    heading_time,
    parse_exchange_heading,
    parse_front_matter,
    parse_transcript,
)

Key = tuple[int, int]  # (conversation number, exchange number) within one session file


@dataclass(frozen=True, slots=True)
class Span:
    """One exchange's lines [start, end) in a transcript split at "\\n"."""

    conversation: int
    exchange: int
    when: datetime
    title: str
    start: int
    end: int

    @property
    def key(self) -> Key:
        return (self.conversation, self.exchange)


@dataclass
class _Layout:
    spans: list[Span]
    preambles: dict[int, list[tuple[int, int]]]  # conversation -> [start, end) of preamble lines


def _scan(lines: list[str]) -> _Layout:
    _, i = parse_front_matter(lines)
    spans: list[Span] = []
    preambles: dict[int, list[tuple[int, int]]] = {}
    conv = 0
    open_span: tuple[int, int, datetime, str, int] | None = None  # conv, number, when, title, start
    pre_start: int | None = None

    def close(at: int) -> None:
        nonlocal open_span, pre_start
        if open_span is not None:
            c, n, when, title, start = open_span
            spans.append(Span(c, n, when, title, start, at))
            open_span = None
        if pre_start is not None:
            if at > pre_start:
                preambles.setdefault(conv, []).append((pre_start, at))
            pre_start = None

    for j in range(i, len(lines)):
        line = lines[j]
        if m := CONV_RE.match(line):
            close(j)
            conv = int(m.group(1))
            pre_start = j + 1
        elif line.startswith("## ") and (parsed := parse_exchange_heading(line[3:])):
            close(j)
            open_span = (conv, parsed[1], parsed[0], parsed[3], j)
    close(len(lines))
    return _Layout(spans, preambles)


def exchange_spans(text: str) -> list[Span]:
    """Every exchange of a transcript, in file order."""
    return _scan(text.split("\n")).spans


def remove_exchanges(text: str, keys: Iterable[Key]) -> tuple[str, int]:
    """`text` without the exchanges named by `keys`; and how many exchanges were cut."""
    wanted = set(keys)
    lines = text.split("\n")
    layout = _scan(lines)
    drop = [False] * len(lines)
    cut = 0
    for span in layout.spans:
        if span.key in wanted:
            cut += 1
            for j in range(span.start, span.end):
                drop[j] = True
    emptied = {s.conversation for s in layout.spans if s.key in wanted} - {
        s.conversation for s in layout.spans if s.key not in wanted
    }
    for conv in emptied:
        for start, end in layout.preambles.get(conv, []):
            for j in range(start + 1, end):  # line `start` is the header's blank line
                drop[j] = True
    if not cut:
        return text, 0
    return "\n".join(line for j, line in enumerate(lines) if not drop[j]), cut


def first_user_titles(text: str) -> dict[int, str]:
    """Conversation number -> its title as the file now says it (first user message).

    A conversation whose exchanges carry no user message gets "" (no title).
    """
    titles: dict[int, str] = {}
    for conv in parse_transcript(text).conversations:
        for exchange in conv.exchanges:
            user = _first_user_message(exchange.parts)
            if user is not None:
                titles.setdefault(conv.number, conversation_title(user))
                break
        titles.setdefault(conv.number, "")
    return titles


def _first_user_message(parts: list[Part]) -> str | None:
    """The text of the first user message: its consecutive `User` parts, joined by spaces
    (as `sessions.chat.first_user_text` joins a message given as a list of parts)."""
    texts: list[str] = []
    for part in parts:
        if part.label.split(" (")[0] == "User":
            texts.append(part.text)
        elif texts:
            break
    return " ".join(texts) if texts else None


def replace_file(path: Path, data: bytes) -> None:
    """Write `data` to a temp file beside `path` (not markdown: no watcher reacts), fsync,
    and rename it over `path`: a reader sees the old file or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".memd-edit.", suffix=".tmp")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def retitle(text: str, title: str) -> str:
    """`text` (freshly rendered exchanges of one conversation) with every exchange heading
    carrying `title` instead of the one it was rendered with ("" drops the title)."""
    title = conversation_title(title)
    lines = text.split("\n")
    for j, line in enumerate(lines):
        if line.startswith("## ") and (parsed := parse_exchange_heading(line[3:])):
            when, number, note, _ = parsed
            heading = f"{heading_time(when)} · exchange {number}" + (f" · {note}" if note else "")
            lines[j] = "## " + heading + (TITLE_SEP + title if title else "")
    return "\n".join(lines)
