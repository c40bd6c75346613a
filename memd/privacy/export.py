"""`memory.export`: every exchange of a client, archived and active alike, a page at a time.

A page is read from one session file at a time, oldest session first, so a whole
history is never held in memory: the cursor names the session and how many of its
exchanges came before (`<session_id>:<n>`). Sessions are the transcript files memd
wrote (`sessions/<id>.md`, or `archive/<id>.md` once compacted); summaries are derived
text and are not exported. Each exchange carries its session, conversation number,
the MCP conversation id where there is one, its time (the heading's, to the second),
the user's text, the assistant's text and every part with its role label, so nothing
of a `both` conversation (system prompts, tool calls) is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from memd.errors import InvalidParams
from memd.indexing import in_range
from memd.layout import ClientLayout
from memd.markdown import SESSION_ID_RE, ParsedExchange, Part, read_transcript

PAGE_SIZE = 200
MAX_PAGE_SIZE = 1000
ConvIds = Mapping[tuple[str, int], str]  # (session_id, conversation) -> MCP conversation id


@dataclass(frozen=True)
class Cursor:
    session_id: str
    skip: int

    def encode(self) -> str:
        return f"{self.session_id}:{self.skip}"

    @classmethod
    def decode(cls, value: str) -> Cursor:
        sid, sep, n = value.rpartition(":")
        if not sep or not SESSION_ID_RE.match(sid) or not n.isdigit() or len(n) > 9:
            raise InvalidParams(
                "cursor is not one memory.export returned", data={"param": "cursor"}
            )
        return cls(sid, int(n))


def session_files(layout: ClientLayout) -> list[tuple[str, Path]]:
    """(session_id, transcript) for every session on disk, oldest first.

    A transcript in sessions/ wins over an archived copy of the same session (the
    archive is the older one while a resumed session is live again).
    """
    found: dict[str, Path] = {}
    for folder in (layout.archive, layout.sessions):
        if folder.is_dir():
            for path in folder.glob("*.md"):
                if SESSION_ID_RE.match(path.stem) and path.is_file():
                    found[path.stem] = path
    return sorted(found.items())


def exchange_record(
    session_id: str, conversation: int, exchange: ParsedExchange, conv_ids: ConvIds
) -> dict[str, Any]:
    """One exchange as export writes it (and as `memd import` reads it back)."""
    user = [p.text for p in exchange.parts if _base(p) == "User"]
    assistant = [p.text for p in exchange.parts if _base(p) == "Assistant"]
    record: dict[str, Any] = {
        "session_id": session_id,
        "conversation": conversation,
        "exchange": exchange.number,
        "time": exchange.when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "user": "\n\n".join(user),
        "assistant": "\n\n".join(assistant),
        "parts": [{"label": p.label, "text": p.text} for p in exchange.parts],
    }
    conv_id = conv_ids.get((session_id, conversation))
    if conv_id is not None:
        record["conversation_id"] = conv_id
    if exchange.note:
        record["note"] = exchange.note
    return record


def _base(part: Part) -> str:
    return part.label.split(" (")[0]


def iter_exchanges(
    layout: ClientLayout,
    conv_ids: ConvIds,
    *,
    after: datetime | None = None,
    before: datetime | None = None,
    start: Cursor | None = None,
) -> Iterator[tuple[Cursor, dict[str, Any]]]:
    """Every exchange from `start` on, each with the cursor that comes after it."""
    for sid, path in session_files(layout):
        if start is not None and sid < start.session_id:
            continue
        skip = start.skip if start is not None and sid == start.session_id else 0
        try:
            parsed = read_transcript(path)
        except FileNotFoundError:  # compacted or forgotten meanwhile
            continue
        n = 0
        for conv in parsed.conversations:
            for exchange in conv.exchanges:
                n += 1
                if n <= skip or not in_range(exchange.when, after, before):
                    continue
                yield Cursor(sid, n), exchange_record(sid, conv.number, exchange, conv_ids)


def export_page(
    layout: ClientLayout,
    conv_ids: ConvIds,
    *,
    after: datetime | None = None,
    before: datetime | None = None,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
) -> dict[str, Any]:
    """One page: up to `limit` exchanges and the cursor of the next page (None at the end)."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidParams(f"limit must be between 1 and {MAX_PAGE_SIZE}", data={"param": "limit"})
    start = Cursor.decode(cursor) if cursor is not None else None
    out: list[dict[str, Any]] = []
    last: Cursor | None = None
    for position, record in iter_exchanges(
        layout, conv_ids, after=after, before=before, start=start
    ):
        if len(out) == limit:
            return {"exchanges": out, "next_cursor": last.encode() if last else None}
        out.append(record)
        last = position
    return {"exchanges": out, "next_cursor": None}


def stored_conversation_ids(layout: ClientLayout) -> dict[tuple[str, int], str]:
    """The MCP conversation ids from the client's state file, read only: for `memd export`
    when the daemon is not running (the files are the user's; the ids make a re-import
    land in the same conversations). Nothing when the state cannot be read."""
    import sqlite3

    from memd.sessions.store import STATE_FILE

    path = layout.state_dir / STATE_FILE
    if not path.is_file():
        return {}
    try:
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT session_id, number, external_id FROM conversations "
                "WHERE kind = 'mcp' AND session_id IS NOT NULL AND external_id IS NOT NULL"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return {}
    return {(sid, number): cid for sid, number, cid in rows}
