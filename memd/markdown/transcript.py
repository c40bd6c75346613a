"""Session transcript files: the markdown layout, escaping, durable appends, archive, restore.

A session file reads like this (every block ends with one blank line)::

    ---
    client_id: laptop
    session_id: 2026-11-30T02-41-07Z-3f9a
    started: 2026-11-30T02:41:07Z
    ---

    # Conversation 1 (2026-11-30 02:41:07 UTC)

    **System:** a preamble (system/developer prompt) sits under the conversation header

    ## 2026-11-30 02:41:07 UTC · exchange 1 — How do I rotate the API keys?

    **User:** How do I rotate the API keys?

    **Assistant:** the answer

The layout is shaped by memsearch's chunker, which splits only at lines matching
`^#{1,6}\\s` and then by size: one `##` heading per exchange keeps a question and its
answer in one chunk (measured: 62% evidence recall@5 against 46% with separate
`## User` / `## Assistant` headings), and the date in the heading is searchable by
BM25. Every exchange heading ends with the conversation's title (its first user message,
cut to 70 characters) after ` — `, so a follow-up question that never names its topic is
still found by it (bench/quality.py: evidence recall@5 67% without, about 90% with). A
note such as `regenerated reply to exchange 2` sits between the number and the title,
after ` · `; notes never contain ` — `.
A conversation that comes back after another one was written gets its header again
(`# Conversation 1 (..., continued)`); header-only sections carry no text and the
chunker drops them, so repeats cost nothing in the index.

Message text is escaped so that it can never pass for structure, and line breaks are
normalised (memd.markdown.text). A giant exchange is kept whole but indexed only up to
`[limits] index_exchange_kib` (memd.markdown.overflow).

The format is one module per concern: `text` (escaping, labels, titles), `parse`
(reading back), `files` (durable appends, reconciliation, archive moves), `overflow` (the
indexing size policy); this module renders blocks and re-exports the rest under the
names memd has always used (`transcript.parse_transcript`, `transcript.AppendFile`).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from memd.markdown import overflow
from memd.markdown.files import (
    SESSION_ID_RE,
    TAIL_BYTES,
    AppendFile,
    fsync_dir,
    is_orphan,
    reconcile,
    restore,
    tail_digest,
)
from memd.markdown.parse import (
    CONV_RE,
    HEADING_TIME,
    ParsedConversation,
    ParsedExchange,
    ParsedTranscript,
    Part,
    parse_exchange_heading,
    parse_exchange_title,
    parse_front_matter,
    parse_transcript,
    read_transcript,
)
from memd.markdown.text import (
    TITLE_CHARS,
    TITLE_SCAN,
    clean_text,
    conversation_title,
    escape_text,
    label,
    unescape_text,
)

__all__ = [
    "CONV_RE",
    "HEADING_TIME",
    "SESSION_ID_RE",
    "TAIL_BYTES",
    "TITLE_CHARS",
    "TITLE_SCAN",
    "TITLE_SEP",
    "AppendFile",
    "ParsedConversation",
    "ParsedExchange",
    "ParsedTranscript",
    "Part",
    "clean_text",
    "conversation_header",
    "conversation_title",
    "escape_text",
    "exchange_block",
    "front_matter",
    "fsync_dir",
    "heading_time",
    "is_orphan",
    "iso",
    "label",
    "new_session_id",
    "parse_exchange_heading",
    "parse_exchange_title",
    "parse_front_matter",
    "parse_transcript",
    "parts_block",
    "read_transcript",
    "reconcile",
    "restore",
    "tail_digest",
    "unescape_text",
]

TITLE_SEP = " — "
# Every exchange heading of a conversation carries the same title: a request rendering
# 75,000 exchanges spent 2.4 s making it safe again and again.
_safe_title = functools.lru_cache(maxsize=64)(conversation_title)
_PLAIN_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:+-]*$")


def new_session_id(started: float) -> str:
    """Sortable by start time, readable, filename-safe: `2026-11-30T02-41-07Z-3f9a`.
    The year is padded by hand: glibc's `%Y` writes year 1 as `1`, not `0001` (a fuzzed
    timestamp made a session file that no session-id pattern accepts)."""
    when = datetime.fromtimestamp(started, UTC)
    return f"{when.year:04d}-{when:%m-%dT%H-%M-%S}Z-{secrets.token_hex(2)}"


def iso(ts: float) -> str:
    when = datetime.fromtimestamp(ts, UTC)
    return f"{when.year:04d}-{when:%m-%dT%H:%M:%S}Z"


def heading_time(when: datetime) -> str:
    # The year by hand: strftime's %Y gives "999", not "0999", for years before 1000 on
    # glibc, and headings must read back (strptime and the heading pattern want 4 digits).
    when = when.astimezone(UTC)
    return f"{when.year:04d}-" + when.strftime(HEADING_TIME.removeprefix("%Y-"))


def front_matter(client_id: str, session_id: str, started: float) -> str:
    cid = client_id if _PLAIN_VALUE_RE.match(client_id) else json.dumps(client_id)
    return f"---\nclient_id: {cid}\nsession_id: {session_id}\nstarted: {iso(started)}\n---\n\n"


def conversation_header(number: int, when: datetime, note: str = "") -> str:
    info = heading_time(when) + (f", {note}" if note else "")
    return f"# Conversation {number} ({info})\n\n"


def parts_block(parts: Sequence[Part], index_chars: int | None = None) -> str:
    """Parts as labelled paragraphs. With `index_chars`, only that many characters of
    them (in order) are indexed, and at least the first `overflow.MESSAGE_FLOOR` of
    each; the rest of a longer message follows a marker line (memd.markdown.overflow)."""
    out: list[str] = []
    room = index_chars
    for p in parts:
        if room is None:
            out.append(f"**{p.label}:** {overflow.body(p.text, None)}\n\n")
            continue
        take = max(room, overflow.MESSAGE_FLOOR)
        out.append(f"**{p.label}:** {overflow.body(p.text, take)}\n\n")
        room = max(0, room - min(len(p.text), take))
    return "".join(out)


def exchange_block(
    number: int,
    when: datetime,
    parts: Sequence[Part],
    note: str = "",
    title: str = "",
    body: str | None = None,
    index_chars: int | None = None,
) -> str:
    """One exchange under its own `##` heading, so question and answer share a chunk.

    The heading carries the conversation's title (made safe with `conversation_title`)
    so that follow-up questions are found by the conversation's topic. `body` is
    `parts_block(parts, index_chars)` made beforehand (off the event loop, for a big
    exchange); `index_chars` bounds what of it is indexed (memd.markdown.overflow).
    """
    heading = f"{heading_time(when)} · exchange {number}" + (f" · {note}" if note else "")
    title = _safe_title(title)
    if title:
        heading += TITLE_SEP + title
    return f"## {heading}\n\n" + (parts_block(parts, index_chars) if body is None else body)
