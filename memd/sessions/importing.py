"""Imports: exchanges from another history written into their own sessions, at their own times.

`memory.import_exchanges` (memd import) is `record_exchange` for the past. An exchange goes
to the session its source names (`session_id`, a memd session id from `memd export`), to
the session its conversation was imported into before, or else to a new session created
*ended* (end reason `imported`): started when its id says (a `memd export` session id
keeps its source's start; a new one is dated by the conversation's first exchange) and
ended at its last exchange. It never lands in today's live session, and no hooks fire.

Nothing is written twice. The `exchange_id` is the idempotency key of
memd.sessions.exchange_keys. An import into the client the file was exported from has no
such key (its exchanges were recorded live): when the named session exists here, its
transcript is read (once per session, in the client's worker thread) and an exchange
whose conversation and number are already in it is a duplicate too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memd.errors import ExchangeConflict, InvalidParams
from memd.layout import ClientLayout
from memd.markdown import SESSION_ID_RE, Part, read_transcript, transcript
from memd.redaction import Scrubber
from memd.sessions import chat, exchange_keys, scrubbing
from memd.sessions.book import COMPACTED, ENDED, Op, title_of
from memd.sessions.core import SessionCore
from memd.sessions.store import Session

Coordinates = set[tuple[int, int]]  # (conversation number, exchange number) in a transcript


class Importer:
    """import_exchanges over one client's SessionCore; a part of ClientSessions."""

    def __init__(self, core: SessionCore) -> None:
        self._core = core
        self._seen: tuple[str, Coordinates] | None = None  # one session's coordinates, read last

    async def import_exchanges(
        self,
        conversation_id: Any,
        exchanges: list[Any],
        session_id: str | None = None,
        title: str | None = None,
    ) -> list[dict[str, Any]]:
        """Write past exchanges of one conversation, in order (see the module doc); one
        result each. All are decided at once and committed together: one write and one
        fsync for the lot (one call per exchange was 30 ms each, the fsyncs)."""
        chat.check_conversation_id(conversation_id)
        if session_id is not None and not SESSION_ID_RE.match(session_id):
            raise InvalidParams("session_id is not a memd session id", data={"param": "session_id"})
        core = self._core
        items = [_item(raw, i, core.scrubber, core.seal_key) for i, raw in enumerate(exchanges)]
        if title is not None:  # scrubbed like the texts: a title is stored and shown too
            title = core.scrubber.scrub(title, private=True).text
        present = [await self._present(session_id, item.origin) for item in items]
        pending: list[Awaitable[None]] = []
        results: list[dict[str, Any]] = []
        async with core.deciding:
            await core.wait_ready()
            op = Op()
            for item, there in zip(items, present, strict=True):
                result, sess = self._decide(op, conversation_id, item, there, session_id, title)
                if sess is not None and op.session is not None and op.session is not sess:
                    pending.append(core.enqueue(op))  # one transcript per change
                    op = Op()
                    result, _ = self._decide(op, conversation_id, item, there, session_id, title)
                results.append(result)
            pending.append(core.enqueue(op))  # also the barrier for duplicates' first calls
        for done in pending:
            await done
        return results

    def _decide(
        self,
        op: Op,
        conversation_id: str,
        item: _Item,
        present: bool,
        session_id: str | None,
        title: str | None,
    ) -> tuple[dict[str, Any], Session | None]:
        """One exchange's fate (under the decision lock); the session it was written to."""
        book = self._core.book
        conv = book.by_external.get(conversation_id)
        seen = book.keys.get(conv.key, item.key) if conv is not None else None
        if seen is not None:
            try:
                return exchange_keys.replay(
                    seen, item.digest, conversation_id, item.key, self._core.layout
                ), None
            except ExchangeConflict as exc:
                return {"error": {"kind": "exchange_conflict", "message": str(exc)}}, None
        if present:
            return self._not_written(session_id, "duplicate"), None
        sess = self._import_session(session_id, conv, item.when)
        if sess.state == COMPACTED:
            return self._not_written(sess.session_id, "session_compacted"), None
        if op.session is not None and op.session is not sess:
            return {}, sess  # the caller queues what it has and decides this one again
        return self._write(op, sess, conversation_id, item, title), sess

    def _not_written(self, session_id: str | None, why: str) -> dict[str, Any]:
        sid = session_id or ""
        return {
            "session_id": sid,
            "conversation": None,
            "path": str(self._core.layout.session_file(sid)) if sid else "",
            "duplicate": why == "duplicate",
            "skipped": why,
        }

    async def _present(self, session_id: str | None, origin: tuple[int, int] | None) -> bool:
        """Whether the named session here already holds the exchange at `origin`."""
        if session_id is None or origin is None or session_id not in self._core.book.sessions:
            return False
        if self._seen is None or self._seen[0] != session_id:
            self._seen = (
                session_id,
                await self._core.cpu(True, _coordinates, self._core.layout, session_id),
            )
        return origin in self._seen[1]

    def _import_session(self, session_id: str | None, conv: Any, when: datetime) -> Session:
        """The session this exchange goes to: named, its conversation's, or a new ended one."""
        book = self._core.book
        sid = session_id or (conv.session_id if conv is not None else None)
        sess = book.sessions.get(sid) if sid else None
        if sess is not None:
            return sess
        stamp = when.timestamp()
        while sid is None or self._taken(sid):
            sid = transcript.new_session_id(stamp)
        # A session id from `memd export` says when the session started (to the second).
        start = _id_time(sid) or stamp
        end = max(start, stamp)
        sess = book.sessions[sid] = Session(sid, ENDED, start, end, end, "imported")
        return sess

    def _taken(self, sid: str) -> bool:
        layout = self._core.layout
        return (
            sid in self._core.book.sessions
            or layout.session_file(sid).exists()
            or layout.archive_file(sid).exists()
        )

    def _write(
        self, op: Op, sess: Session, conversation_id: str, item: _Item, title: str | None
    ) -> dict[str, Any]:
        """Decide one past exchange into `sess` and `op` (under the decision lock)."""
        book, when = self._core.book, item.when
        stamp = when.timestamp()
        conv = book.by_external.get(conversation_id)
        if conv is None:
            conv = book.by_external[conversation_id] = book.new_conv("mcp", conversation_id)
            conv.title = title_of(title or item.parts[0].text)
        header = book.header_if_due(sess, conv, when)
        conv.exchanges += 1
        block = transcript.exchange_block(
            conv.exchanges,
            when,
            item.parts,
            title=conv.title or "",
            index_chars=self._core.index_chars,
        )
        op.keys.append(book.keys.add(conv.key, item.key, item.digest, sess.session_id, conv.number))
        op.redacted.update(item.redacted)
        if sess.state == ENDED and sess.end_reason == "imported":
            sess.ended = max(sess.ended or stamp, stamp)
        book.append(op, sess, conv, stamp, header + block)
        if self._seen is not None and self._seen[0] == sess.session_id:
            self._seen[1].add((conv.number, conv.exchanges))  # as its transcript now reads
        return {
            "session_id": sess.session_id,
            "conversation": conv.number,
            "path": str(self._core.layout.session_file(sess.session_id)),
            "duplicate": False,
            "redacted": sum(item.redacted.values()),
        }


@dataclass(frozen=True, slots=True)
class _Item:
    """One exchange of an import call, checked before anything is decided."""

    key: str
    when: datetime
    parts: list[Part]
    digest: bytes
    origin: tuple[int, int] | None
    redacted: Counter[str]


def _item(raw: Any, i: int, scrubber: Scrubber, seal_key: bytes) -> _Item:
    """exchanges[i] checked: user, assistant, timestamp, exchange_id; conversation and
    exchange (its numbers in the source session) optional. Scrubbed (memd.sessions.
    scrubbing) before anything is hashed or written, as record_exchange is."""
    at = f"exchanges[{i}]"
    if not isinstance(raw, dict):
        raise InvalidParams(f"{at} must be an object", data={"param": at})
    unknown = sorted(
        set(raw) - {"user", "assistant", "timestamp", "exchange_id", "conversation", "exchange"}
    )
    if unknown:
        raise InvalidParams(
            f"unknown param {at}.{unknown[0]}", data={"param": f"{at}.{unknown[0]}"}
        )
    key = exchange_keys.check_exchange_id(raw.get("exchange_id"))
    when = chat.parse_timestamp(raw.get("timestamp"))
    for name, value in (("exchange_id", key), ("timestamp", when)):
        if value is None:
            raise InvalidParams(f"{at}.{name} is required", data={"param": f"{at}.{name}"})
    assert key is not None and when is not None
    asked, said, kinds = scrubbing.scrub_pair(
        scrubber,
        chat.require_text(raw.get("user"), f"{at}.user"),
        chat.require_text(raw.get("assistant"), f"{at}.assistant"),
    )
    parts = [Part("User", asked), Part("Assistant", said)]
    numbers = (raw.get("conversation"), raw.get("exchange"))
    origin = numbers if all(isinstance(n, int) and n > 0 for n in numbers) else None
    digest = exchange_keys.digest(asked, said, seal_key)
    return _Item(key, when, parts, digest, origin, kinds)  # type: ignore[arg-type]


def _coordinates(layout: ClientLayout, session_id: str) -> Coordinates:
    """(conversation, exchange) of every exchange in a session's transcript, live or archived."""
    for path in (layout.session_file(session_id), layout.archive_file(session_id)):
        if path.is_file():
            parsed = read_transcript(path)
            return {(c.number, e.number) for c in parsed.conversations for e in c.exchanges}
    return set()


def _id_time(session_id: str) -> float | None:
    """The start time a memd session id carries (`2026-11-30T02-41-07Z-3f9a`), or None."""
    try:
        when = datetime.strptime(session_id[:20], "%Y-%m-%dT%H-%M-%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=UTC).timestamp()
