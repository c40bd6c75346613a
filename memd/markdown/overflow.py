"""The indexing size policy: a giant exchange is kept whole, but indexed only in part.

memsearch re-chunks a session file on every change and embeds each new chunk of at most
1,500 characters: three 8 MiB exchanges made 16,783 and then 39,158 chunks, and that
client's later exchanges became searchable only 26 minutes later (issue #13). So each
record call's exchange block is indexed up to `[limits] index_exchange_kib` (times 1,024
characters, shared by its messages in order, but at least the first MESSAGE_FLOOR of
each, so a short answer after a giant question is still found); past that the rest of
a message is written after a marker line::

    **User:** the first characters of a pasted log ...
    --- memd: 2,097,152 more characters of this message are kept here, not indexed ---
    ... the rest of it, to the end

The file keeps every character: `parse_transcript` joins the two halves back exactly
(export, forget, compaction and recall's expand all read the whole text), while memd's
`memsearch watch` chunks `index_view(text)`, where the marker line and the rest of that
message are blank lines. Blank, not removed, so every chunk keeps its true line numbers
and recall expands a hit from the real file. The cut is made when the exchange is
written; changing the limit later changes only exchanges written after it.

The marker starts with `---`, which message lines are never allowed to (they are
escaped), so only memd writes it; the rest of the message is escaped like any text, so
it ends at the next part, heading or conversation header, as every message does.
"""

from __future__ import annotations

import re

from memd.markdown.text import LABELS, escape_text

_MARK_RE = re.compile(
    r"^--- memd: [\d,]+ more characters of this message are kept here, not indexed ---$"
)
_MARK_LINE_RE = re.compile(_MARK_RE.pattern, re.MULTILINE)
# Where a message's text ends: a heading or header, or the next part's label.
_NEXT_RE = re.compile(rf"^(?:#|\*\*(?:{LABELS})(?: \([^*\n]*\))?:\*\*(?: |$))", re.MULTILINE)
MESSAGE_FLOOR = 1024  # characters of every message indexed, whatever the exchange's room
_CUT_SLACK = 0.75  # a cut may move back to a line or word break this far into the room


def mark(rest: int) -> str:
    """The marker line for a message whose last `rest` characters are not indexed."""
    return f"--- memd: {rest:,} more characters of this message are kept here, not indexed ---"


def is_mark(line: str) -> bool:
    return line.startswith("--- memd: ") and _MARK_RE.match(line) is not None


def cut(text: str, room: int) -> int:
    """Where to split `text` so its first part holds at most `room` characters: after a
    line or word break near the end when there is one (a word cut in two is found by
    neither half)."""
    if len(text) <= room:
        return len(text)
    floor = int(room * _CUT_SLACK)
    for sep in ("\n", " "):
        at = text.rfind(sep, floor, room)
        if at >= 0:
            return at + 1
    return max(room, 0)


def body(text: str, room: int | None) -> str:
    """A message's escaped text with at most `room` characters before the marker (None:
    all of it indexed)."""
    if room is None or len(text) <= room:
        return escape_text(text)
    at = cut(text, room)
    return f"{escape_text(text[:at])}\n{mark(len(text) - at)}\n{escape_text(text[at:])}"


def join(lines: list[str]) -> tuple[list[str], list[str]] | None:
    """A message's lines split at its marker (never its first line): (indexed, kept), or
    None when it has none."""
    for i in range(1, len(lines)):
        if lines[i].startswith("--- memd: ") and is_mark(lines[i]):
            return lines[:i], lines[i + 1 :]
    return None


def index_view(text: str) -> str:
    """What memsearch chunks of a transcript: the text with every marker line and the
    rest of its message blanked out, line for line (the same number of lines)."""
    if "\n--- memd: " not in text:
        return text
    out: list[str] = []
    last = 0
    for m in _MARK_LINE_RE.finditer(text):
        if m.start() < last:
            continue  # within a message already blanked
        end = _NEXT_RE.search(text, m.end())
        stop = end.start() if end else len(text)
        out += (text[last : m.start()], "\n" * text.count("\n", m.start(), stop))
        last = stop
    out.append(text[last:])
    return "".join(out)
