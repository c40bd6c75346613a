"""Message text as the transcript holds it: line breaks, escaping, labels, titles.

Message text may contain anything. So that it can neither split a chunk nor pass for
structure, a message line that starts with `#`, `---` or a role marker such as
`**User` gets one extra leading backslash (also when it already starts with
backslashes), which `unescape_text` removes again: the round trip is exact. Line breaks
are the one thing normalised: `\\r\\n`, `\\r` and the other separators that
`str.splitlines` honours become `\\n`, because memsearch's chunker numbers lines with
`split("\\n")` while its expand uses `splitlines()`; mixed separators would make
them disagree about where a section starts.
"""

from __future__ import annotations

import re
import unicodedata

# Longest alternatives first: "Tool call" must win over "Tool".
LABELS = "Tool call|Function call|User|Assistant|System|Developer|Tool|Function"
_ROLE_WORDS = "User|Assistant|System|Developer|Tool|Function"
_BREAK_CHARS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAKS_RE = re.compile("\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_STRUCTURAL = rf"\\*(?:#|---|\*\*(?:{_ROLE_WORDS})\b)"
_ESCAPE_RE = re.compile(rf"^(?={_STRUCTURAL})", re.MULTILINE)
_UNESCAPE_RE = re.compile(rf"^\\(?={_STRUCTURAL})", re.MULTILINE)
# A part's first line: `**User:** text`, `**Tool call (lookup · call_1):** {...}`.
MARKER_RE = re.compile(rf"^\*\*((?:{LABELS})(?: \([^*\n]*\))?):\*\*(?: |$)")
TITLE_CHARS = 70
TITLE_SCAN = 4096  # characters of a message a title or label is made from


def clean_text(text: str) -> str:
    """Make text safe to write: one kind of line break, no lone surrogates (invalid UTF-8)."""
    # `in` scans at memchr speed; the regex took 0.75 s over 8 MiB on the event loop.
    if any(ch in text for ch in _BREAK_CHARS):
        text = _sub_in_pieces(_BREAKS_RE, "\n", text)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def escape_text(text: str) -> str:
    """Demote lines that would read as structure (headings, fences, role markers)."""
    return _sub_in_pieces(_ESCAPE_RE, "\\", text)


SUB_CHUNK = 64 * 1024
_LOOKAHEAD = 256  # characters past a piece a match that starts in it may look at


def _sub_in_pieces(pattern: re.Pattern[str], literal: str, text: str) -> str:
    """`pattern.sub` with a literal replacement, in pieces of SUB_CHUNK characters.

    One `re.sub` never lets go of the GIL: over 8 MiB it held every other thread, the
    event loop included, for most of a second even when run in a worker thread. Here the
    matching runs per piece (`finditer` with pos/endpos keeps `^` true to real line
    starts), so the interpreter can switch threads between pieces.
    """
    if len(text) <= SUB_CHUNK:
        return pattern.sub(literal.replace("\\", "\\\\"), text)
    out: list[str] = []
    last = pos = 0
    size = len(text)
    while pos < size:
        end = min(size, pos + SUB_CHUNK)
        for m in pattern.finditer(text, pos, min(size, end + _LOOKAHEAD)):
            if m.start() >= end:
                break
            out += (text[last : m.start()], literal)
            last = m.end()
        pos = max(end, last)
    out.append(text[last:])
    return "".join(out)


def unescape_text(text: str) -> str:
    """Exact inverse of `escape_text`."""
    return _UNESCAPE_RE.sub("", text)


def label(base: str, detail: str = "") -> str:
    """A part label; the detail (tool name, call id, user name) is made single-line and safe."""
    detail = "".join(
        " " if unicodedata.category(ch)[0] in "CZ" else ch
        for ch in detail[:TITLE_SCAN].replace("*", "").replace("(", "[").replace(")", "]")
    )
    detail = " ".join(detail.split())[:80]
    return f"{base} ({detail})" if detail else base


def conversation_title(text: str) -> str:
    """A conversation's title from its first user message: one line, at most 70 characters.

    Whitespace and control characters collapse to single spaces, so the title can never
    end the heading line; a longer text is cut at a word boundary and ends with `…`. Only
    the first TITLE_SCAN characters are looked at, so the cost does not grow with the
    message (a title of nothing but whitespace in them is empty).
    """
    text = text[:TITLE_SCAN]  # bounded by what is kept: 3 s on the event loop for 8 MiB
    text = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text)
    text = " ".join(text.split())
    if len(text) <= TITLE_CHARS:
        return text
    cut = text[:TITLE_CHARS]
    if text[TITLE_CHARS] != " " and " " in cut:
        cut = cut[: cut.rindex(" ")]
    cut = cut.rstrip()
    if len(cut) >= TITLE_CHARS:
        cut = cut[: TITLE_CHARS - 1].rstrip()
    return cut + "…"
