"""Reading a session file back: conversations, exchanges and exact message texts."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from memd.markdown import overflow
from memd.markdown.text import MARKER_RE, unescape_text

HEADING_TIME = "%Y-%m-%d %H:%M:%S UTC"
CONV_RE = re.compile(r"^# Conversation (\d+) \((.*)\)$")
_EXCHANGE_TITLE_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC) · exchange (\d+)(?: · (.+?))?(?: — (.*))?$"
)


@dataclass(frozen=True, slots=True)
class Part:
    """One message as written: a role label (`User`, `Tool call (f · id)`, ...) and its text."""

    label: str
    text: str


@dataclass
class ParsedExchange:
    number: int
    when: datetime
    note: str
    parts: list[Part] = field(default_factory=list)
    title: str = ""


@dataclass
class ParsedConversation:
    number: int
    info: str  # what the header says in parentheses: time, "continued ..."
    preamble: list[Part] = field(default_factory=list)
    exchanges: list[ParsedExchange] = field(default_factory=list)


@dataclass
class ParsedTranscript:
    meta: dict[str, str]
    conversations: list[ParsedConversation]


def parse_exchange_title(title: str) -> tuple[datetime, int, str] | None:
    """Time, number and note of an exchange heading (chunker heading text, without `## `).

    Recall uses this to filter by time with the precision of one exchange.
    """
    parsed = parse_exchange_heading(title)
    return parsed[:3] if parsed else None


@functools.lru_cache(maxsize=8192)
def parse_exchange_heading(title: str) -> tuple[datetime, int, str, str] | None:
    """Time, number, note and conversation title of an exchange heading (without `## `).

    Remembered: recall parses the heading of every candidate (strptime was ~1.5 ms of a
    recall at 10k chunks), and the same headings come back search after search."""
    m = _EXCHANGE_TITLE_RE.match(title)
    if not m:
        return None
    # The pattern fixed the form: fromisoformat reads it ~30x faster than strptime (a
    # forget parses every heading of a session), and fails on the same bad dates.
    when = datetime.fromisoformat(m.group(1)[:-4]).replace(tzinfo=UTC)
    return when, int(m.group(2)), m.group(3) or "", m.group(4) or ""


def parse_transcript(text: str) -> ParsedTranscript:
    """Read a session file back into conversations, exchanges and exact message texts.

    Lenient about lines it does not know (a person may have edited the file): they stay
    part of the message text around them. Exchanges before any conversation header land
    in a conversation numbered 0.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    meta, start = parse_front_matter(lines)
    convs: list[ParsedConversation] = []
    exchange: ParsedExchange | None = None
    part: tuple[str, list[str], list[Part]] | None = None

    def flush() -> None:
        nonlocal part
        if part is not None:
            name, body, target = part
            if body and body[-1] == "":
                body.pop()  # the blank separator line after every part
            target.append(Part(name, _message_text(body)))
            part = None

    def conversation() -> ParsedConversation:
        if not convs:
            convs.append(ParsedConversation(0, ""))
        return convs[-1]

    for line in lines[start:]:
        if m := CONV_RE.match(line):
            flush()
            convs.append(ParsedConversation(int(m.group(1)), m.group(2)))
            exchange = None
        elif line.startswith("## ") and (parsed := parse_exchange_heading(line[3:])):
            flush()
            exchange = ParsedExchange(parsed[1], parsed[0], parsed[2], title=parsed[3])
            conversation().exchanges.append(exchange)
        elif m := MARKER_RE.match(line):
            flush()
            target = exchange.parts if exchange else conversation().preamble
            part = (m.group(1), [line[m.end() :]], target)
        elif part is not None:
            part[1].append(line)
    flush()
    return ParsedTranscript(meta, convs)


def _message_text(lines: list[str]) -> str:
    """A message's exact text from its lines, joined again where memd cut it for the
    index (memd.markdown.overflow)."""
    halves = overflow.join(lines)
    if halves is None:
        return unescape_text("\n".join(lines))
    indexed, kept = halves
    return unescape_text("\n".join(indexed)) + unescape_text("\n".join(kept))


def parse_front_matter(lines: list[str]) -> tuple[dict[str, str], int]:
    if not lines or lines[0] != "---":
        return {}, 0
    meta: dict[str, str] = {}
    for i in range(1, len(lines)):
        if lines[i] == "---":
            return meta, i + 1
        key, _, value = lines[i].partition(":")
        value = value.strip()
        if value.startswith('"'):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        meta[key.strip()] = value
    return meta, len(lines)


def read_transcript(path: Path) -> ParsedTranscript:
    return parse_transcript(path.read_bytes().decode("utf-8", "replace"))
