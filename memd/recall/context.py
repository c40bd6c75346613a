"""The answer after a question: the user's next message, shown after a result that asks one.

A conversation answers a question in the turn after it. When a result's exchange ends with
the assistant asking something ("What made you pick it?"), the answer is the user's next
message, in the next exchange, which shares few words with the question and is often not
found by the search itself. Recall then shows that message after the result, marked as
the next exchange's (`FOLLOW_LABEL`), clipped to `FOLLOW_CHARS`.

Measured on the LoCoMo dev split (bench/locomo.py, docs/quality.md): evidence recall@5
goes from 0.69 to about 0.76 for some 280 more characters per answer (2,161 to ~2,450 on
average), more than any ranking change tried; showing the next message after every
result, question or not, costs twice the characters for about the same gain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memd.markdown import parse_exchange_title

FOLLOW_CHARS = 400  # at most this much of the next message (300 finds as much)
FOLLOW_LABEL = "**User (next exchange):**"
_CLIP = " […]"

_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+)$")
_MARKER_RE = re.compile(r"^\*\*([^*\n]+):\*\*(?: |$)")  # any role marker (escaped text has none)
_USER = "User"
# Statements end at . or ! before a space; a "?" after the last of them asks something
# ("What made you pick it?", "Did it work? Let me know."). Measured on the dev split,
# this finds more answers than "ends with ?" (0.764 against 0.757 offline) for 50 more
# characters per answer, and fewer characters than any "?" anywhere (0.767, +65).
_SENTENCE_END_RE = re.compile(r"(?<=[.!])\s+")


def asks(message: str) -> bool:
    """Whether the message asks something after its last statement."""
    text = message.strip()
    return bool(text) and "?" in _SENTENCE_END_RE.split(text)[-1]


def last_message(section: str) -> str:
    """The text of the section's last message (after its last role marker), or ""."""
    lines = section.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if m := _MARKER_RE.match(lines[i]):
            return "\n".join([lines[i][m.end() :], *lines[i + 1 :]])
    return ""


def next_exchange(lines: Sequence[str], end: int) -> tuple[int, int] | None:
    """(start, end) 0-based line span of the exchange right after a section that ends before
    0-based line `end`, when that is the next exchange of the same conversation (a
    `# Conversation` header between them means another conversation)."""
    i = end
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or not lines[i].startswith("## "):
        return None
    if parse_exchange_title(lines[i][3:]) is None:
        return None
    j = i + 1
    while j < len(lines):
        m = _HEADING_RE.match(lines[j])
        if m and len(m.group(1)) <= 2:
            break
        j += 1
    return i, j


def previous_exchange(lines: Sequence[str], start: int) -> tuple[int, int] | None:
    """(start, end) 0-based line span of the exchange right before a section whose heading
    is 0-based line `start`, when that is an exchange of the same conversation."""
    i = start - 1
    while i >= 0:
        m = _HEADING_RE.match(lines[i])
        if m and len(m.group(1)) <= 2:
            break
        i -= 1
    if i < 0 or not lines[i].startswith("## ") or parse_exchange_title(lines[i][3:]) is None:
        return None
    return i, start


def user_message(lines: Sequence[str]) -> str:
    """The text of the first `**User:**` message among lines, up to the next role marker."""
    out: list[str] | None = None
    for line in lines:
        m = _MARKER_RE.match(line)
        if out is None:
            if m and m.group(1) == _USER:
                out = [line[m.end() :]]
        elif m:
            break
        else:
            out.append(line)
    return "\n".join(out or []).strip()


def follow(section: str, lines: Sequence[str], end: int) -> tuple[int, str] | None:
    """The next exchange's first line and its user message, marked and clipped, when the
    section (ending before 0-based line `end` of the file's `lines`) ends by asking a
    question; None otherwise."""
    if not asks(last_message(section)):
        return None
    span = next_exchange(lines, end)
    if span is None:
        return None
    text = user_message(lines[span[0] : span[1]])
    if not text:
        return None
    return span[0], f"{FOLLOW_LABEL} {clip_words(text, FOLLOW_CHARS)}"


def clip_words(text: str, limit: int) -> str:
    """At most `limit` characters of text, cut at a word break, with a marker when cut."""
    if len(text) <= limit:
        return text
    room = max(limit - len(_CLIP), 1)
    piece = text[:room]
    at = piece.rfind(" ")
    if at >= room * 3 // 4:
        piece = piece[:at]
    return piece.rstrip() + _CLIP
