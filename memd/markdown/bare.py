"""What a chunk says, without the lines memd itself wrote around it: the text a sentence
model embeds.

An exchange's chunk starts with its heading (`## 2024-03-01 09:03:00 UTC · exchange 4 —
How do I descale a kettle?`: the time and the conversation's title, which is another
exchange's first message) and labels its messages (`**User:** `). BM25 wants those (a
date, the topic a follow-up leaves out); a sentence transformer does not: they outweigh
a one-line fact, and all-MiniLM-L6-v2 put the fact among the top 3 for 58% of
bench/paraphrase.py's paraphrases with them and 92% without (docs/quality.md, round 5).

memd writes these lines, so it knows their exact form (docs/transcripts.md): exchange
headings and conversation headers are dropped whole, a summary heading keeps its topic
but not its time range, message labels and the overflow marker line go, and escaped
message lines get their text back. Nothing else changes; a text with nothing else left
(a bare heading) is kept as it was, so it still has a direction.
"""

from __future__ import annotations

import re

from memd.markdown.overflow import is_mark
from memd.markdown.parse import CONV_RE, parse_exchange_heading
from memd.markdown.text import MARKER_RE, unescape_text

_HEADING_RE = re.compile(r"^#{1,6}\s+(.+)$")
_SPAN_RE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC – \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    r"(?: · (?:session )?summary)?(?: · )?"
)
_BLANKS_RE = re.compile(r"\n{3,}")


def bare_text(text: str) -> str:
    """`text` without memd's headings, labels and marker lines (see the module docstring)."""
    out = [_line(line) for line in _body(text).split("\n")]
    bare = _BLANKS_RE.sub("\n\n", unescape_text("\n".join(x for x in out if x is not None)))
    return bare.strip() or text


def _body(text: str) -> str:
    """Front matter (`---` ... `---` at the very start) left out."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 3)
        if end >= 0:
            return text[end + 5 :]
    return text


def _line(line: str) -> str | None:
    """One line as embedded; None drops it."""
    if is_mark(line):
        return None
    if heading := _HEADING_RE.match(line):
        title = heading.group(1).strip()
        if CONV_RE.match(line) or parse_exchange_heading(title):
            return None
        topic = _SPAN_RE.sub("", title).strip()
        return topic or None
    if label := MARKER_RE.match(line):
        return line[label.end() :]
    return line
