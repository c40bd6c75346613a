"""One client's sessions and conversations: recording, prefix matching, expiry, resume.

Sessions. A session starts with the first write of a new conversation when the client
has no current session, and ends once `now >= min(last_activity + inactivity,
(resumed or started) + max_duration)`: checked by `expire(now)` (the daemon's monitor)
and by every record call, so a late monitor never lets a session run long. A session
ends at that deadline, not when it is noticed. Timestamps passed for imports only label
exchanges; session timing follows the clock.

Conversations. `mcp_via_llm`: one per MCP session id (`conversation_id`); a retried
exchange with the same `exchange_id` writes nothing (memd.sessions.exchange_keys). `both`: the
longest recorded prefix of the request decides continuation, regenerate, edit or a new
conversation (chat.PrefixIndex documents the rules and their cost).

Resume. A conversation always continues in its own session's file. If that session has
ended (or been compacted), it is reopened: the `on_restore` hooks run first (compaction
cancels its work, moves `archive/<id>.md` back and removes the summary; without hooks the
store moves the file back itself), then the session is active again, `resumed` now, its
maximum duration counted from there. A client can so have several active sessions: the
one started fresh is the *current* one, where new conversations go; resumed ones take
only their own conversations. Each ends on its own deadline and fires `on_end` again.

Decisions. Every call that changes a client's state decides under that client's
decision lock, so decisions never interleave, and queues its change before it lets go:
changes commit in the order they were decided. The state and its rules are
`memd.sessions.book.SessionBook`. A big request's CPU-heavy part (matching a long
history against the prefix index, rendering thousands of messages) runs in the client's
own worker thread while the lock is held: the event loop goes on serving every other
client, and this client's later records wait their turn. A write that failed meanwhile
voids the state (it is reloaded); a decision that was in a thread sees that and decides
again. A `record_chat` of 150k messages had held the loop for about 24 s.

Durability. One writer per client takes everything queued and commits it through
`memd.sessions.store.StateStore` in this client's IO thread (appends with one write and
one fsync per file, then the state), and only then answers the callers (group commit):
callers wait for their commit outside the lock, so the next decisions go into the next
batch. See `memd.sessions.store` for what recovery does after kill -9.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import structlog

from memd.errors import StorageError
from memd.layout import ClientLayout
from memd.redaction import Scrubber
from memd.sessions import chat, rescrub
from memd.sessions.book import ACTIVE, Op
from memd.sessions.committer import maybe_await
from memd.sessions.core import SessionCore
from memd.sessions.erase import Erased, erase
from memd.sessions.events import EventKind, Hook, SessionInfo
from memd.sessions.importing import Importer
from memd.sessions.recording import OFFLOAD_CHARS, OFFLOAD_MESSAGES, Recorder
from memd.sessions.store import Change, Conv, Session

log = structlog.get_logger()

__all__ = ["OFFLOAD_CHARS", "OFFLOAD_MESSAGES", "ClientSessions"]


class ClientSessions:
    """Sessions and conversations of one client. Use `async with` or open()/close().

    All methods are coroutines for the daemon's event loop; file and sqlite work runs in
    this client's own IO thread, the heavy part of a big request in its worker thread
    (see the module doc), and the prefix index reads nodes it no longer holds (the
    newest `index_capacity` stay in memory) from a read-only connection. `clock` returns
    epoch seconds (tests pass a fake one). Hooks get a session's `SessionInfo`: `on_end`
    after a session ended, `on_resume` after one was reopened, and `on_restore` before
    one is reopened (awaited; if it raises, the record call fails with StorageError and
    nothing is written).
    """

    def __init__(
        self,
        layout: ClientLayout,
        *,
        inactivity_minutes: float = 180.0,
        max_minutes: float = 480.0,
        clock: Callable[[], float] = time.time,
        on_end: Sequence[Hook] = (),
        on_resume: Sequence[Hook] = (),
        on_restore: Sequence[Hook] = (),
        index_capacity: int = chat.INDEX_CAPACITY,
        index_exchange_chars: int | None = None,
        scrubber: Scrubber | None = None,
    ) -> None:
        self.layout = layout
        self.client_id = layout.client_id
        self.on_end: list[Hook] = list(on_end)
        self.on_resume: list[Hook] = list(on_resume)
        self.on_restore: list[Hook] = list(on_restore)
        self._core = SessionCore(
            layout,
            clock=clock,
            hooks=self._hooks,
            index_capacity=index_capacity,
            scrubber=scrubber or Scrubber(),
        )
        self.set_limits(inactivity_minutes, max_minutes, index_exchange_chars)
        self._recorder = Recorder(self._core, self._reopen)
        self._importer = Importer(self._core)
        self._reopening: dict[str, asyncio.Future[None]] = {}

    @property
    def scrubber(self) -> Scrubber:
        """The daemon's scrubber, from [privacy]; a config reload sets a new one."""
        return self._core.scrubber

    @scrubber.setter
    def scrubber(self, scrubber: Scrubber) -> None:
        self._core.scrubber = scrubber

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> ClientSessions:
        core = self._core
        core.hashing = ThreadPoolExecutor(1, thread_name_prefix=f"memd-hash-{self.client_id}")
        core.committer.start()
        try:
            await core.reload()
        except BaseException:
            await core.committer.close()
            raise
        return self

    async def close(self) -> None:
        """Finish queued writes and hooks, then release files and the database."""
        await self._core.committer.close()
        if self._core.hashing is not None:
            self._core.hashing.shutdown(wait=False)

    async def __aenter__(self) -> ClientSessions:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_limits(
        self,
        inactivity_minutes: float,
        max_minutes: float,
        index_exchange_chars: int | None = None,
    ) -> None:
        """New timeouts and indexing bound (config reload); they apply at the next check
        or write. `index_exchange_chars` (None: no bound) is memd.markdown.overflow's."""
        if not inactivity_minutes > 0 or not max_minutes > 0:
            raise ValueError("session limits must be positive minutes")
        if index_exchange_chars is not None and index_exchange_chars < 1:
            raise ValueError("index_exchange_chars must be positive (None: no bound)")
        self._core.set_limits(
            float(inactivity_minutes) * 60.0, float(max_minutes) * 60.0, index_exchange_chars
        )

    # --- record calls (memd.sessions.recording, memd.sessions.importing) -----------------

    async def record_exchange(
        self,
        conversation_id: Any,
        user: Any,
        assistant: Any,
        timestamp: Any = None,
        exchange_id: Any = None,
    ) -> dict[str, Any]:
        """mcp_via_llm: append one exchange to a conversation (Recorder.record_exchange)."""
        return await self._recorder.record_exchange(
            conversation_id, user, assistant, timestamp, exchange_id
        )

    async def record_chat(
        self, messages: Any, response: Any, timestamp: Any = None, after: Any = None
    ) -> dict[str, Any]:
        """both: record an OpenAI chat call (Recorder.record_chat)."""
        return await self._recorder.record_chat(messages, response, timestamp, after)

    async def import_exchanges(
        self,
        conversation_id: Any,
        exchanges: list[Any],
        session_id: str | None = None,
        title: str | None = None,
    ) -> list[dict[str, Any]]:
        """Past exchanges of one conversation, in order (Importer.import_exchanges)."""
        return await self._importer.import_exchanges(conversation_id, exchanges, session_id, title)

    def redaction_counts(self) -> dict[str, int]:
        """Secrets redacted on record so far, by kind (what `memd status` shows)."""
        return dict(self._core.disk.redacted)

    # --- resume --------------------------------------------------------------------------

    async def _reopen(self, conv: Conv) -> None:
        """Reopen the ended or compacted session of `conv`; see the module doc.

        Concurrent calls for the same session share one reopen: the others wait for it
        and then decide again.
        """
        assert conv.session_id is not None
        sid = conv.session_id
        if (running := self._reopening.get(sid)) is not None:
            await asyncio.shield(running)
            return
        done = self._reopening[sid] = asyncio.get_running_loop().create_future()
        try:
            await self._core.committer.submit(Change(), [], wait_hooks=True)
            sess = self._core.book.sessions.get(sid)
            if sess is None or sess.state == ACTIVE:
                return
            await self._run_restore_hooks(sess)
            async with self._core.deciding:
                await self._core.wait_ready()  # a failed write meanwhile reloads the state
                sess = self._core.book.sessions.get(sid)
                if sess is None or sess.state == ACTIVE:
                    return
                op = Op(reopen=sid)
                layout = self.layout
                if not (layout.session_file(sid).exists() or layout.archive_file(sid).exists()):
                    # Its files were deleted: the file starts afresh, so the next write must
                    # open with its conversation's header again.
                    sess.last_conv = None
                self._core.book.resume(sess, self._core.clock(), op)
                pending = self._core.enqueue(op)
            await pending
        finally:
            del self._reopening[sid]
            done.set_result(None)

    async def _run_restore_hooks(self, sess: Session) -> None:
        info = self._core.book.info(sess)
        for hook in self.on_restore:
            try:
                await maybe_await(hook(info))
            except Exception as exc:
                log.warning(
                    "session.restore_hook_failed",
                    client=self.client_id,
                    session=sess.session_id,
                    error=str(exc),
                )
                raise StorageError(f"could not restore session {sess.session_id}: {exc}") from exc

    # --- monitor and inspection ----------------------------------------------------------

    async def expire(self, now: float | None = None) -> list[dict[str, Any]]:
        """End every active session whose time is up; the monitor calls this periodically."""
        async with self._core.deciding:
            await self._core.wait_ready()
            now = self._core.clock() if now is None else now
            op = Op()
            for sess in list(self._core.book.active.values()):
                self._core.book.end_if_due(sess, now, op)
            if not op.events:
                return []
            pending = self._core.enqueue(op, wait_hooks=True)
        await pending
        return [_row(info) for info in op.ended()]

    async def close_active(self, now: float | None = None) -> list[dict[str, Any]]:
        """End every active session now (sessions.close); their infos, [] when none was.

        The current session comes first, then the resumed ones, oldest first.
        """
        async with self._core.deciding:
            await self._core.wait_ready()
            at = self._core.clock() if now is None else now
            op, book = Op(), self._core.book
            for sess in sorted(
                book.active.values(), key=lambda s: (s is not book.current, s.started)
            ):
                # max(): the wall clock may have been stepped back since the last activity
                book.end(sess, max(at, sess.last_activity), "closed", op)
            if not op.events:
                return []
            pending = self._core.enqueue(op, wait_hooks=True)
        await pending
        return [_row(info) for info in op.ended()]

    async def mark_compacted(self, session_id: str) -> None:
        """Compaction moved this ended session's transcript to archive/."""
        async with self._core.deciding:
            await self._core.wait_ready()
            op = Op()
            self._core.book.compacted(session_id, op)
            pending = self._core.enqueue(op)
        await pending

    async def list_sessions(self) -> list[dict[str, Any]]:
        """Every session of this client, oldest first (ties in the order they started)."""
        await self._core.wait_ready()
        book = self._core.book
        return [_row(book.info(s)) for s in sorted(book.sessions.values(), key=lambda s: s.started)]

    def conversation_ids(self) -> dict[tuple[str, int], str]:
        """(session_id, conversation number) -> MCP conversation id, for every mcp one."""
        return {
            (c.session_id, c.number): c.external_id
            for c in self._core.book.by_external.values()
            if c.session_id is not None and c.external_id is not None
        }

    async def erase(
        self, cuts: Mapping[str, set[tuple[int, int]]], files_lock: threading.Lock | None = None
    ) -> Erased:
        """Cut exchanges out of files and state for `memory.forget` (memd.sessions.erase).

        Record calls are refused with `busy` while it runs (one rewrite per file); whatever
        was decided before is committed first, and memory is rebuilt from the state
        afterwards.
        """
        return await self._core.paused(erase, self._core.disk, cuts, files_lock)

    async def redact(
        self, only: Sequence[str] | None, dry_run: bool, files_lock: threading.Lock | None
    ) -> dict[str, Any]:
        """`memd redact` (memd.sessions.rescrub): a real one pauses records like `erase`."""
        if dry_run:
            return (await asyncio.to_thread(rescrub.scan, self.layout, self.scrubber, only)).row()
        found = await self._core.paused(
            rescrub.rescrub, self._core.disk, self.scrubber, only, files_lock
        )
        return found.row()

    async def resync(self) -> None:
        """Read the state again after files moved behind its back (a summary dropped, a
        transcript brought back from archive/): each session's state follows its file."""
        await self._core.paused(None)

    def active_session(self) -> dict[str, Any] | None:
        """The current session (where new conversations go), or None."""
        current = self._core.book.current
        return _row(self._core.book.info(current)) if current else None

    def active_sessions(self) -> list[dict[str, Any]]:
        """Every active session, the current one and resumed ones, oldest first."""
        book = self._core.book
        return [_row(book.info(s)) for s in sorted(book.active.values(), key=lambda s: s.started)]

    # --- hooks --------------------------------------------------------------------------

    def _hooks(self, kind: EventKind) -> Sequence[Hook]:
        return self.on_end if kind == "end" else self.on_resume


def _row(info: SessionInfo) -> dict[str, Any]:
    """A session's info as the API's JSON row (callers add keys to it, e.g. compaction)."""
    return cast(dict[str, Any], info)
