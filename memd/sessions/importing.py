"""Imports: exchanges from another history written into their own sessions, at their own times.

`memory.import_exchange` (memd import) is `record_exchange` for the past. An exchange goes
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

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from memd.errors import InvalidParams
from memd.layout import ClientLayout
from memd.markdown import SESSION_ID_RE, Part, read_transcript, transcript
from memd.sessions import chat, exchange_keys
from memd.sessions.book import COMPACTED, ENDED, Op, SessionBook, title_of
from memd.sessions.store import Session

T = TypeVar("T")
Coordinates = set[tuple[int, int]]  # (conversation number, exchange number) in a transcript


class Importing:
    """import_exchange; ClientSessions provides the state, the lock and the writer."""

    layout: ClientLayout
    _book: SessionBook
    _deciding: Any  # asyncio.Lock
    _index_chars: int | None
    _seen: tuple[str, Coordinates] | None = None  # one session's coordinates, read last

    async def _wait_ready(self) -> None:
        raise NotImplementedError

    def _enqueue(self, op: Op, *, wait_hooks: bool = False) -> Awaitable[None]:
        raise NotImplementedError

    async def _cpu(self, big: bool, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def import_exchange(
        self,
        conversation_id: Any,
        user: Any,
        assistant: Any,
        timestamp: Any,
        exchange_id: Any,
        session_id: str | None = None,
        origin: tuple[int, int] | None = None,
        title: str | None = None,
    ) -> dict[str, Any]:
        """Write one past exchange (see the module doc); `origin` is its (conversation,
        exchange) numbers in the source session `session_id`."""
        chat.check_conversation_id(conversation_id)
        key = exchange_keys.check_exchange_id(exchange_id)
        if key is None:
            raise InvalidParams("exchange_id is required", data={"param": "exchange_id"})
        when = chat.parse_timestamp(timestamp)
        if when is None:
            raise InvalidParams("timestamp is required", data={"param": "timestamp"})
        if session_id is not None and not SESSION_ID_RE.match(session_id):
            raise InvalidParams("session_id is not a memd session id", data={"param": "session_id"})
        parts = [
            Part("User", chat.require_text(user, "user")),
            Part("Assistant", chat.require_text(assistant, "assistant")),
        ]
        digest = exchange_keys.digest(parts[0].text, parts[1].text)
        present = await self._present(session_id, origin)
        async with self._deciding:
            await self._wait_ready()
            book = self._book
            conv = book.by_external.get(conversation_id)
            seen = book.keys.get(conv.key, key) if conv is not None else None
            if seen is not None:
                pending: Awaitable[Any] = self._enqueue(Op())  # its first call is on disk
                result = exchange_keys.replay(seen, digest, conversation_id, key, self.layout)
            elif present:
                pending, result = self._enqueue(Op()), self._not_written(session_id, "duplicate")
            else:
                sess = self._import_session(session_id, conv, when)
                if sess.state == COMPACTED:
                    pending = self._enqueue(Op())
                    result = self._not_written(sess.session_id, "session_compacted")
                else:
                    pending, result = self._write(
                        sess, conversation_id, key, digest, parts, when, title
                    )
        await pending
        return result

    def _not_written(self, session_id: str | None, why: str) -> dict[str, Any]:
        sid = session_id or ""
        return {
            "session_id": sid,
            "conversation": None,
            "path": str(self.layout.session_file(sid)) if sid else "",
            "duplicate": why == "duplicate",
            "skipped": why,
        }

    async def _present(self, session_id: str | None, origin: tuple[int, int] | None) -> bool:
        """Whether the named session here already holds the exchange at `origin`."""
        if session_id is None or origin is None or session_id not in self._book.sessions:
            return False
        if self._seen is None or self._seen[0] != session_id:
            self._seen = (session_id, await self._cpu(True, _coordinates, self.layout, session_id))
        return origin in self._seen[1]

    def _import_session(self, session_id: str | None, conv: Any, when: datetime) -> Session:
        """The session this exchange goes to: named, its conversation's, or a new ended one."""
        book = self._book
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
        layout = self.layout
        return (
            sid in self._book.sessions
            or layout.session_file(sid).exists()
            or layout.archive_file(sid).exists()
        )

    def _write(
        self,
        sess: Session,
        conversation_id: str,
        key: str,
        digest: bytes,
        parts: list[Part],
        when: datetime,
        title: str | None,
    ) -> tuple[Awaitable[None], dict[str, Any]]:
        """Decide and queue one past exchange into `sess` (under the decision lock)."""
        book, op, stamp = self._book, Op(), when.timestamp()
        conv = book.by_external.get(conversation_id)
        if conv is None:
            conv = book.by_external[conversation_id] = book.new_conv("mcp", conversation_id)
            conv.title = title_of(title or parts[0].text)
        header = book.header_if_due(sess, conv, when)
        conv.exchanges += 1
        block = transcript.exchange_block(
            conv.exchanges, when, parts, title=conv.title or "", index_chars=self._index_chars
        )
        op.keys.append(book.keys.add(conv.key, key, digest, sess.session_id, conv.number))
        if sess.state == ENDED and sess.end_reason == "imported":
            sess.ended = max(sess.ended or stamp, stamp)
        book.append(op, sess, conv, stamp, header + block)
        if self._seen is not None and self._seen[0] == sess.session_id:
            self._seen = None
        result = {
            "session_id": sess.session_id,
            "conversation": conv.number,
            "path": str(self.layout.session_file(sess.session_id)),
            "duplicate": False,
        }
        return self._enqueue(op), result


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
