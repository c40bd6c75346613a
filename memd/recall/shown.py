"""What one recall shows: each section once, titles once, and the dates said in it made absolute.

- No two results share a line (`Shown.add`): a section that overlaps one already shown
  is skipped, and a `# Conversation` header's hit is its own preamble (`Shown.section`),
  never the whole conversation (memsearch's expand rule went to the next `#` heading, so
  one system-prompt hit repeated every exchange the other results showed).
- The conversation's title that every exchange heading repeats is not shown
  (`Shown.untitled`): on LoCoMo it was 150 of 2,700 characters an answer, and found
  nothing (docs/quality.md).
- `dated` adds one line to an exchange that says relative dates ("yesterday", "last
  Saturday", "two weeks ago"): each resolved against the exchange's own time, so an LLM
  reading "I went yesterday" months later knows the day (memd.indexing.query.dates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from memd.indexing import Hit, Section, expand_hit
from memd.indexing.query.dates import said_dates
from memd.markdown import SESSION_ID_RE, TITLE_SEP, parse_exchange_heading
from memd.recall.context import FOLLOW_LABEL, clip_words
from memd.recall.output import Memory

DATES_LABEL = "(dates said:"
MAX_DATES = 3  # at most this many resolved dates per result


class Shown:
    """The line spans of the sections a recall shows, per file."""

    def __init__(self) -> None:
        self._spans: dict[Path, list[tuple[int, int]]] = {}

    @staticmethod
    def section(hit: Hit, path: Path, sessions: Path, lines: Sequence[str]) -> Section:
        """The hit's section; in a transcript, a `# Conversation` header's chunk (a system
        prompt under it) ends at the conversation's first exchange."""
        if hit.heading_level == 1 and path.suffix == ".md" and SESSION_ID_RE.match(path.stem):
            hit = dataclasses.replace(hit, heading_level=6)  # to the next heading of any level
        return expand_hit(hit, sessions, lines)

    def add(self, path: Path, start: int, end: int) -> bool:
        """Record the span [start, end]; False when it overlaps one already shown."""
        spans = self._spans.setdefault(path, [])
        if any(start <= b and a <= end for a, b in spans):
            return False
        spans.append((start, end))
        return True

    def forget(self, path: Path, start: int, end: int) -> None:
        """Take back a span `add` recorded."""
        self._spans[path].remove((start, end))

    def starts(self) -> set[tuple[Path, int]]:
        """(file, first line) of every section shown."""
        return {(p, a) for p, spans in self._spans.items() for a, _ in spans}

    @staticmethod
    def untitled(heading: str, content: str) -> str:
        """`content` without the conversation title its exchange heading repeats: the
        label names the conversation, and the conversation's first exchange holds the
        title's words itself (the title is its first user message). The result's
        `heading` keeps it."""
        parsed = parse_exchange_heading(heading)
        if not parsed or not parsed[3]:
            return content
        first, sep, rest = content.partition("\n")
        if not first.endswith(TITLE_SEP + parsed[3]):
            return content
        return first[: -len(TITLE_SEP + parsed[3])] + sep + rest


def headless(content: str, heading: str) -> tuple[str, int]:
    """An exchange's text without its heading line, and how many lines went with it.

    The heading says the exchange's time and number; the result's label says the time
    already (and the result's `heading` keeps the number): on LoCoMo the line was 40 of
    every 450 characters an answer. A heading with a note (`regenerated reply to
    exchange 2`) stays: the note is said nowhere else."""
    parsed = parse_exchange_heading(heading)
    first, _sep, rest = content.partition("\n")
    if not parsed or parsed[2] or not first.startswith("## ") or not rest.strip():
        return content, 0
    body = rest.lstrip("\n")
    return body, 1 + len(rest) - len(body)


def dated(content: str, hit: Hit) -> str:
    """The exchange's text, followed by the relative dates said in it made absolute
    (`(dates said: yesterday = 7 May 2023; last Saturday = 6 May 2023)`)."""
    if hit.when is None:
        return content
    _heading, _sep, body = content.partition("\n")
    said: dict[str, str] = {}
    for s in said_dates(body, hit.when):
        said.setdefault(s.phrase, s.absolute())
    if not said:
        return content
    return f"{content}\n\n{DATES_LABEL} {'; '.join(list(said.values())[:MAX_DATES])})"


NEIGHBOUR_CHARS = 300  # of the neighbouring exchange's text shown inside a result
NEXT_LABEL = "**Next exchange:**"
PREVIOUS_LABEL = "**Previous exchange:**"


class Neighbours:
    """Hits beyond the top_k that are the exchange right before or after a result.

    Such a hit matched the query on its own; beside its neighbour it is worth a few
    hundred characters (the first `NEIGHBOUR_CHARS` of its messages) where a result of
    its own would cost a whole section and a place in the top_k. Each is shown once, in
    the first result it borders, never when it is a result itself or overlaps one."""

    def __init__(self) -> None:
        self._results: list[tuple[Path, int, int]] = []
        self._offered: list[tuple[Path, Section]] = []

    def shown(self, path: Path, section: Section) -> None:
        self._results.append((path, section.start_line, section.end_line))

    def results(self) -> list[tuple[Path, int, int]]:
        """Each result's file and 1-based line span, in the order `shown` was called."""
        return list(self._results)

    def offer(self, path: Path, section: Section) -> None:
        self._offered.append((path, section))

    def attach(self, memories: list[Memory], shown: Shown) -> list[Memory]:
        """The memories (in the order `shown` was called) with their neighbours inside."""
        out = list(memories)
        for path, section in self._offered:
            if not shown.add(path, section.start_line, section.end_line):
                continue  # overlaps a result, or a neighbour placed already
            placed = self._place(out, path, section)
            if not placed:
                shown.forget(path, section.start_line, section.end_line)
        return out

    def _place(self, out: list[Memory], path: Path, section: Section) -> bool:
        for i, (p, start, end) in enumerate(self._results):
            if p != path:
                continue
            if section.start_line == end + 1 and FOLLOW_LABEL not in out[i].content:
                label = NEXT_LABEL
            elif section.end_line + 1 == start:
                label = PREVIOUS_LABEL
            else:
                continue
            text = clip_words(_body(section.content), NEIGHBOUR_CHARS)
            if not text:
                return False
            out[i] = dataclasses.replace(out[i], content=f"{out[i].content}\n\n{label} {text}")
            return True
        return False


def _body(section: str) -> str:
    """An exchange's messages without its heading, on as few lines as they take."""
    return body_text(section.split("\n"))


def body_text(lines: Sequence[str]) -> str:
    """The messages of an exchange's lines (its heading first), on as few lines as they take."""
    return " ".join(line.strip() for line in lines[1:] if line.strip())
