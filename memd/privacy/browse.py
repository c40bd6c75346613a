"""Reading a client's memory for a viewer: its conversations, one conversation's exchanges,
and what a forget would remove, all read from the transcript files (never the state).

A viewer (the memory browser, memd.ui) pages through a conversation instead of loading
it whole, and every message text is cut to a window (`text_offset`, `text_limit`), so a
5 MB paste costs the viewer one window of it. The files are the truth: what a person
edited away is not shown, and a compacted session is read from archive/ beside its
summary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from memd.errors import NotFound
from memd.indexing import in_range
from memd.layout import ClientLayout
from memd.markdown import ParsedExchange, Span, exchange_spans, parse_transcript
from memd.privacy.export import ConvIds, session_files
from memd.privacy.select import ExternalIds, Plan, Selector, plan

SUMMARY_LIMIT = 256 * 1024  # characters of a summary a page shows


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _state(layout: ClientLayout, sid: str, path: Path, states: Mapping[str, str]) -> str:
    if sid in states:
        return states[sid]
    return "compacted" if path.parent == layout.archive else "ended"


def _summary(layout: ClientLayout, sid: str) -> str | None:
    try:
        with open(layout.summary_file(sid), encoding="utf-8", errors="replace") as fh:
            return fh.read(SUMMARY_LIMIT)
    except FileNotFoundError:
        return None


def list_conversations(
    layout: ClientLayout,
    conv_ids: ConvIds,
    states: Mapping[str, str],
    after: datetime | None = None,
    before: datetime | None = None,
) -> list[dict[str, Any]]:
    """Sessions newest first, each with its conversations newest first.

    A conversation is listed when one of its exchanges falls in [after, before); its
    counts are of the whole conversation (`chars`: of its exchanges' markdown). Only the
    headings are read (`exchange_spans`): parsing every message of a 2,000-exchange file
    took ~0.7 s under load, its spans ~0.09 s.
    """
    out: list[dict[str, Any]] = []
    for sid, path in reversed(session_files(layout)):
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        convs = _conversations(text, sid, conv_ids, after, before)
        if convs:
            out.append(
                {
                    "session_id": sid,
                    "state": _state(layout, sid, path, states),
                    "archived": path.parent == layout.archive,
                    "summary": layout.summary_file(sid).exists(),
                    "conversations": convs,
                }
            )
    return out


def _conversations(
    text: str,
    sid: str,
    conv_ids: ConvIds,
    after: datetime | None,
    before: datetime | None,
) -> list[dict[str, Any]]:
    """A transcript's conversations newest first, those with an exchange in [after, before)."""
    lines = text.split("\n")
    by_conv: dict[int, list[Span]] = {}
    for span in exchange_spans(text):
        by_conv.setdefault(span.conversation, []).append(span)
    convs = []
    for number in sorted(by_conv, reverse=True):
        spans = by_conv[number]
        times = [x.when for x in spans]
        if not any(in_range(t, after, before) for t in times):
            continue
        convs.append(
            {
                "number": number,
                "conversation_id": conv_ids.get((sid, number)),
                "title": next((x.title for x in spans if x.title), ""),
                "first": _iso(min(times)),
                "last": _iso(max(times)),
                "exchanges": len(spans),
                "chars": sum(len(line) + 1 for x in spans for line in lines[x.start : x.end]),
            }
        )
    return convs


def _exchange(x: ParsedExchange, text_offset: int, text_limit: int) -> dict[str, Any]:
    return {
        "exchange": x.number,
        "time": _iso(x.when),
        "title": x.title,
        "note": x.note,
        "parts": [
            {
                "label": p.label,
                "text": p.text[text_offset : text_offset + text_limit],
                "length": len(p.text),
            }
            for p in x.parts
        ],
    }


def read_conversation(
    layout: ClientLayout,
    conv_ids: ConvIds,
    states: Mapping[str, str],
    session_id: str,
    number: int,
    *,
    offset: int = 0,
    limit: int = 50,
    around: int | None = None,
    text_offset: int = 0,
    text_limit: int = 20_000,
) -> dict[str, Any]:
    """Exchanges [offset, offset + limit) of one conversation, each text cut to its window.

    The file's headings are scanned and only the page's exchanges are parsed, so a page of
    a 2,000-exchange conversation costs one scan, not a parse of every message.

    With `around` (an exchange number) the page is the one of `limit` exchanges that
    holds that exchange, so a link to an exchange finds it after others were forgotten.
    """
    path = dict(session_files(layout)).get(session_id)
    try:
        text = path.read_bytes().decode("utf-8", "replace") if path else None
    except FileNotFoundError:
        text = None
    if path is None or text is None:
        raise NotFound(f"no session {session_id!r}", data={"session_id": session_id})
    spans = [s for s in exchange_spans(text) if s.conversation == number]
    offset = _page_start(spans, session_id, number, offset, limit, around)
    lines = text.split("\n")
    page = [_parsed(lines[s.start : s.end]) for s in spans[offset : offset + limit]]
    return {
        "session_id": session_id,
        "conversation": number,
        "conversation_id": conv_ids.get((session_id, number)),
        "title": next((x.title for x in spans if x.title), ""),
        "state": _state(layout, session_id, path, states),
        "archived": path.parent == layout.archive,
        "summary": _summary(layout, session_id),
        "total": len(spans),
        "offset": offset,
        "exchanges": [_exchange(x, text_offset, text_limit) for x in page],
    }


def _page_start(
    spans: list[Span], session_id: str, number: int, offset: int, limit: int, around: int | None
) -> int:
    """The page's first exchange: `offset`, or the page of `limit` that holds `around`."""
    if not spans:
        raise NotFound(
            f"no conversation {number} in session {session_id}", data={"conversation": number}
        )
    if around is None:
        return offset
    index = next((i for i, x in enumerate(spans) if x.exchange == around), None)
    if index is None:
        raise NotFound(
            f"no exchange {around} in conversation {number} of session {session_id}",
            data={"exchange": around},
        )
    return index // limit * limit


def _parsed(lines: list[str]) -> ParsedExchange:
    """One exchange's lines read back; only the page's exchanges are parsed."""
    [conv] = parse_transcript("\n".join(lines)).conversations
    return conv.exchanges[0]


def preview(
    layout: ClientLayout,
    selector: Selector,
    external: ExternalIds,
    hits: list[tuple[str, str, int | None]],
) -> dict[str, Any]:
    """What `memory.forget` with `selector` would remove now, exchange by exchange.

    `fingerprint` names exactly this set: a viewer sends it back with its confirmation
    and forgets only while the preview still holds (see memd.ui.forget).
    """
    todo = plan(layout, selector, external, hits)
    files = dict(session_files(layout))
    rows: list[dict[str, Any]] = []
    for sid in sorted(todo.cuts, reverse=True):
        keys = todo.cuts[sid]
        try:
            text = files[sid].read_bytes().decode("utf-8", "replace")
        except (KeyError, FileNotFoundError):
            continue
        rows += [
            {
                "session_id": sid,
                "conversation": s.conversation,
                "exchange": s.exchange,
                "time": _iso(s.when),
                "title": s.title,
            }
            for s in exchange_spans(text)
            if s.key in keys
        ]
    return {
        "selector": selector.describe(),
        "exchanges": rows,
        "counts": {
            "exchanges": todo.exchanges,
            "sessions": len(todo.cuts),
            "summaries": len(todo.summaries),
        },
        "summaries": sorted(todo.summaries),
        "fingerprint": fingerprint(todo),
    }


def fingerprint(todo: Plan) -> str:
    """A short digest of a plan: equal plans, equal digests."""
    items = sorted((sid, c, x) for sid, keys in todo.cuts.items() for c, x in keys)
    digest = hashlib.sha256(repr((items, sorted(todo.summaries))).encode())
    return digest.hexdigest()[:24]
