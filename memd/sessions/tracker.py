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

Durability. Record calls decide synchronously on the event loop (so decisions never
interleave) and queue the bytes; one writer per client takes everything queued and
commits it through `session_store.StateStore` in this client's IO thread (appends with
one write and one fsync per file, then the state), and only then answers the callers
(group commit). See `memd.sessions.store` for what recovery does after kill -9.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from memd.errors import StorageError
from memd.layout import ClientLayout
from memd.markdown import Part, transcript
from memd.sessions import chat, exchange_keys
from memd.sessions.committer import Committer, maybe_await
from memd.sessions.erase import Erased, erase
from memd.sessions.exchange_keys import ExchangeKeys, KeyRow, Recorded
from memd.sessions.store import Change, Hook, StateStore
from memd.sessions.store import Conv as _Conv
from memd.sessions.store import Session as _Session

log = structlog.get_logger()

OFFLOAD_MESSAGES = 256  # hash bigger requests in a thread, off the event loop
# Clean and escape bigger exchanges in a thread: 7.5 MiB held the event loop for 0.8 s.
OFFLOAD_CHARS = 256 * 1024


@dataclass
class _Op:
    """What one call decided: bytes for one transcript, state rows, events for hooks."""

    session: _Session | None = None
    text: list[str] = field(default_factory=list)
    touched: dict[str, _Session] = field(default_factory=dict)
    convs: dict[int, _Conv] = field(default_factory=dict)
    nodes: list[chat.Node] = field(default_factory=list)
    keys: list[KeyRow] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reopen: str | None = None


class ClientSessions:
    """Sessions and conversations of one client. Use `async with` or open()/close().

    All methods are coroutines for the daemon's event loop; file and sqlite work runs in
    this client's own IO thread, except the prefix index's lookups of nodes it no longer
    holds (the newest `index_capacity` stay in memory; older ones are read on the loop
    from a read-only connection). `clock` returns epoch seconds (tests pass a fake one).
    Hooks get a session's info dict: `on_end` after a session ended, `on_resume` after
    one was reopened, and `on_restore` before one is reopened (awaited; if it raises,
    the record call fails with StorageError and nothing is written).
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
    ) -> None:
        self.layout = layout
        self._index_capacity = index_capacity  # nodes, and exchange keys, kept in memory
        self.client_id = layout.client_id
        self.on_end: list[Hook] = list(on_end)
        self.on_resume: list[Hook] = list(on_resume)
        self.on_restore: list[Hook] = list(on_restore)
        self._clock = clock
        self.set_limits(inactivity_minutes, max_minutes, index_exchange_chars)
        self._disk = StateStore(layout)
        self._committer = Committer(self._disk, self.client_id, self._hooks, self._after_failure)
        self._sessions: dict[str, _Session] = {}
        self._active: dict[str, _Session] = {}
        self._current: _Session | None = None  # the active session started fresh
        self._reopening: dict[str, asyncio.Future[None]] = {}
        self._convs: dict[int, _Conv] = {}
        self._next_conv = 0
        self._by_external: dict[str, _Conv] = {}
        self._index = chat.PrefixIndex()
        self._keys = ExchangeKeys()
        self._ready = asyncio.Event()
        # Set when reloading the state after a failed write failed too (disk read-only,
        # full): calls fail fast with StorageError and the next call tries the reload again.
        self._broken: Exception | None = None
        self._reload_lock = asyncio.Lock()
        # This client's own hashing thread (started on first use, stopped by close()): the
        # loop's default executor also runs recall searches, which can all be stuck on a
        # hung index server for their whole timeout.
        self._hashing: ThreadPoolExecutor | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> ClientSessions:
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix=f"memd-hash-{self.client_id}")
        self._committer.start()
        try:
            await self._reload()
        except BaseException:
            await self._committer.close()
            raise
        return self

    async def close(self) -> None:
        """Finish queued writes and hooks, then release files and the database."""
        await self._committer.close()
        if self._hashing is not None:
            self._hashing.shutdown(wait=False)

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
        self._inactivity = float(inactivity_minutes) * 60.0
        self._max = float(max_minutes) * 60.0
        self._index_chars = index_exchange_chars

    # --- recording -----------------------------------------------------------------------

    async def record_exchange(
        self,
        conversation_id: Any,
        user: Any,
        assistant: Any,
        timestamp: Any = None,
        exchange_id: Any = None,
    ) -> dict[str, Any]:
        """mcp_via_llm: append one user/assistant exchange to conversation `conversation_id`.

        An `exchange_id` seen before in it writes nothing: see memd.sessions.exchange_keys.
        """
        chat.check_conversation_id(conversation_id)
        key = exchange_keys.check_exchange_id(exchange_id)
        if (
            isinstance(user, str)
            and isinstance(assistant, str)
            and len(user) + len(assistant) > OFFLOAD_CHARS
        ):
            parts, body = await asyncio.get_running_loop().run_in_executor(
                self._hashing, _exchange_parts, user, assistant, self._index_chars
            )
        else:
            parts, body = _exchange_parts(user, assistant, self._index_chars)
        when = chat.parse_timestamp(timestamp)
        digest = exchange_keys.digest(parts[0].text, parts[1].text) if key is not None else b""
        while True:
            await self._wait_ready()
            if key is not None and self._recorded(conversation_id, key) is not None:
                await self._committer.submit(Change(), [])  # barrier: its first call is on disk
                if (seen := self._recorded(conversation_id, key)) is not None:
                    return exchange_keys.replay(seen, digest, conversation_id, key, self.layout)
                continue  # its first call failed after all: decide again
            now, op = self._clock(), _Op()
            conv = self._by_external.get(conversation_id)
            sess = self._target(conv, now, op)
            if sess is not None:
                break
            await self._reopen(conv)
        if conv is None:
            conv = self._by_external[conversation_id] = self._new_conv("mcp", conversation_id)
            conv.title = _title(parts[0].text)
        stamp = when or _dt(now)
        header = self._header_if_due(sess, conv, stamp)
        conv.exchanges += 1
        block = transcript.exchange_block(
            conv.exchanges, stamp, parts, title=conv.title or "", body=body
        )
        if key is not None:
            op.keys.append(self._keys.add(conv.key, key, digest, sess.session_id, conv.number))
        self._append(op, sess, conv, now, header + block)
        await self._submit(op)
        return {
            "session_id": sess.session_id,
            "conversation": conv.number,
            "path": str(self.layout.session_file(sess.session_id)),
            "duplicate": False,
        }

    def _recorded(self, conversation_id: str, key: str) -> Recorded | None:
        """What the first call with this key recorded (maybe not on disk yet), or None."""
        conv = self._by_external.get(conversation_id)
        return self._keys.get(conv.key, key) if conv is not None else None

    async def record_chat(
        self, messages: Any, response: Any, timestamp: Any = None
    ) -> dict[str, Any]:
        """both: record an OpenAI chat call (the messages sent and the reply); see module doc."""
        when = chat.parse_timestamp(timestamp)
        if isinstance(messages, list) and len(messages) > OFFLOAD_MESSAGES and self._hashing:
            msgs, resp, hashes = await asyncio.get_running_loop().run_in_executor(
                self._hashing, chat.prepare, messages, response
            )
        else:
            msgs, resp, hashes = chat.prepare(messages, response)
        while True:
            await self._wait_ready()
            now, op = self._clock(), _Op()
            k, kind, key, ref = self._index.classify(msgs, hashes)
            conv = self._convs[key] if key is not None else None
            if kind == "duplicate":
                assert conv is not None
                return await self._duplicate(conv, now, op)
            sess = self._target(conv, now, op)
            if sess is not None:
                break
            await self._reopen(conv)
        if conv is None:
            conv = self._new_conv("chat", None)
        if conv.title is None:  # the request carries the whole history: its first question
            conv.title = _title(chat.first_user_text(msgs))
        stamp = when or _dt(now)
        header = self._header_if_due(sess, conv, stamp)
        new = [*msgs[k:], resp]
        note = {
            "regenerated": f"regenerated reply to exchange {ref}",
            "edited": f"edited, branches after exchange {ref}",
            "branch": f"branch after exchange {ref}",
        }.get(kind, "")
        join_open = kind == "continuation" and not header and ref == conv.exchanges
        text, numbers, conv.exchanges = chat.render(
            new,
            conv.exchanges,
            stamp,
            note,
            preamble=kind == "new",
            join_open=join_open,
            title=conv.title or "",
            index_chars=self._index_chars,
        )
        op.nodes = self._index.add(hashes, k, numbers, conv.key)
        self._append(op, sess, conv, now, header + text)
        await self._submit(op)
        return self._chat_result(conv, kind, len(new))

    async def _duplicate(self, conv: _Conv, now: float, op: _Op) -> dict[str, Any]:
        """A retried call: nothing is written; it only counts as activity of a live session."""
        sess = self._sessions.get(conv.session_id or "")
        if sess is not None and sess.state == "active" and not self._end_if_due(sess, now, op):
            self._touch(op, sess, conv, now)
        await self._submit(op)
        return self._chat_result(conv, "duplicate", 0)

    def _chat_result(self, conv: _Conv, kind: str, appended: int) -> dict[str, Any]:
        sid = conv.session_id or ""
        return {
            "session_id": sid,
            "conversation": conv.number,
            "new_conversation": kind == "new",
            "appended": appended,
            "match": kind,
            "path": str(self.layout.session_file(sid)) if sid else "",
        }

    # --- sessions ------------------------------------------------------------------------

    def _target(self, conv: _Conv | None, now: float, op: _Op) -> _Session | None:
        """The session a conversation's next write goes to; None: reopen its session first."""
        sess = self._sessions.get(conv.session_id) if conv and conv.session_id else None
        if sess is None:
            return self._current_for_write(now, op)
        if sess.state != "active":
            return None
        deadline, reason = self._deadline(sess)
        if now >= deadline:
            # Its time was up but no monitor had noticed: it ends at its deadline and its
            # own conversation reopens it at once. Nothing left sessions/: no hooks.
            self._end(sess, deadline, reason, op, quiet=True)
            self._resume(sess, now, op)
        return sess

    def _current_for_write(self, now: float, op: _Op) -> _Session:
        """The current session, after ending it if its time is up; a new one if none."""
        if self._current is not None:
            self._end_if_due(self._current, now, op)
        if self._current is None:
            sid = transcript.new_session_id(now)
            while (
                sid in self._sessions
                or self.layout.session_file(sid).exists()
                or self.layout.archive_file(sid).exists()
            ):
                sid = transcript.new_session_id(now)
            sess = self._sessions[sid] = _Session(sid, "active", now, now)
            self._active[sid] = self._current = sess
            log.info("session.started", client=self.client_id, session=sid)
        return self._current

    async def _reopen(self, conv: _Conv | None) -> None:
        """Make the ended or compacted session of `conv` active again (see module doc).

        Earlier end hooks finish first, so no compaction of it is queued after the
        restore hooks ran. One reopen per session at a time; other calls wait for it
        and then decide again.
        """
        assert conv is not None and conv.session_id is not None
        sid = conv.session_id
        if (running := self._reopening.get(sid)) is not None:
            await asyncio.shield(running)
            return
        done = self._reopening[sid] = asyncio.get_running_loop().create_future()
        try:
            await self._committer.submit(Change(), [], wait_hooks=True)
            sess = self._sessions.get(sid)
            if sess is None or sess.state == "active":
                return
            await self._run_restore_hooks(sess)
            await self._wait_ready()  # a failed write meanwhile reloads the state
            sess = self._sessions.get(sid)
            if sess is None or sess.state == "active":
                return
            op = _Op(reopen=sid)
            layout = self.layout
            if not (layout.session_file(sid).exists() or layout.archive_file(sid).exists()):
                # Its files were deleted: the file starts afresh, so the next write must
                # open with its conversation's header again.
                sess.last_conv = None
            self._resume(sess, self._clock(), op)
            await self._submit(op)
        finally:
            del self._reopening[sid]
            done.set_result(None)

    async def _run_restore_hooks(self, sess: _Session) -> None:
        info = self._info(sess)
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

    def _resume(self, sess: _Session, now: float, op: _Op) -> None:
        old = sess.state
        sess.state, sess.ended, sess.end_reason = "active", None, None
        sess.resumed, sess.resumes = now, sess.resumes + 1
        sess.last_activity = max(sess.last_activity, now)
        self._active[sess.session_id] = sess
        op.touched[sess.session_id] = sess
        op.events.append(("resume", {**self._info(sess), "old_state": old}))
        log.info(
            "session.resumed",
            client=self.client_id,
            session=sess.session_id,
            old_state=old,
            resumes=sess.resumes,
        )

    def _deadline(self, sess: _Session) -> tuple[float, str]:
        idle = sess.last_activity + self._inactivity
        longest = (sess.started if sess.resumed is None else sess.resumed) + self._max
        return (idle, "inactivity") if idle <= longest else (longest, "max_duration")

    def _end_if_due(self, sess: _Session, now: float, op: _Op) -> bool:
        deadline, reason = self._deadline(sess)
        if now < deadline:
            return False
        self._end(sess, deadline, reason, op)
        return True

    def _end(self, sess: _Session, at: float, reason: str, op: _Op, *, quiet: bool = False) -> None:
        sess.state, sess.ended, sess.end_reason = "ended", at, reason
        self._active.pop(sess.session_id, None)
        if self._current is sess:
            self._current = None
        op.touched[sess.session_id] = sess
        if not quiet:
            op.events.append(("end", self._info(sess)))
        log.info("session.ended", client=self.client_id, session=sess.session_id, reason=reason)

    def _new_conv(self, kind: str, external_id: str | None) -> _Conv:
        self._next_conv += 1
        conv = _Conv(self._next_conv, kind, external_id, None)
        self._convs[conv.key] = conv
        return conv

    def _header_if_due(self, sess: _Session, conv: _Conv, stamp: datetime) -> str:
        """A conversation header when the file's last section belongs to another one."""
        if sess.last_conv == conv.key:
            return ""
        sess.last_conv = conv.key
        if conv.session_id == sess.session_id:
            return transcript.conversation_header(conv.number, stamp, "continued")
        old = conv.session_id  # not None only if the state lost its session: start afresh
        sess.conversations += 1
        conv.session_id, conv.number = sess.session_id, sess.conversations
        note = f"continued from {old}" if old else ""
        return transcript.conversation_header(conv.number, stamp, note)

    def _append(self, op: _Op, sess: _Session, conv: _Conv, now: float, text: str) -> None:
        op.session = sess
        op.text.append(text)
        self._touch(op, sess, conv, now)

    def _touch(self, op: _Op, sess: _Session, conv: _Conv, now: float) -> None:
        sess.last_activity = max(sess.last_activity, now)
        conv.last_active = now
        op.touched[sess.session_id] = sess
        op.convs[conv.key] = conv

    # --- monitor and inspection ----------------------------------------------------------

    async def expire(self, now: float | None = None) -> list[dict[str, Any]]:
        """End every active session whose time is up; the monitor calls this periodically."""
        await self._wait_ready()
        now = self._clock() if now is None else now
        op = _Op()
        for sess in list(self._active.values()):
            self._end_if_due(sess, now, op)
        if not op.events:
            return []
        await self._submit(op, wait_hooks=True)
        return [info for kind, info in op.events if kind == "end"]

    async def close_active(self, now: float | None = None) -> list[dict[str, Any]]:
        """End every active session now (sessions.close); their infos, [] when none was.

        The current session comes first, then the resumed ones, oldest first.
        """
        await self._wait_ready()
        at = self._clock() if now is None else now
        op = _Op()
        for sess in sorted(
            self._active.values(), key=lambda s: (s is not self._current, s.started)
        ):
            # max(): the wall clock may have been stepped back since the last activity
            self._end(sess, max(at, sess.last_activity), "closed", op)
        if not op.events:
            return []
        await self._submit(op, wait_hooks=True)
        return [info for _, info in op.events]

    async def mark_compacted(self, session_id: str) -> None:
        """Compaction moved this ended session's transcript to archive/."""
        await self._wait_ready()
        sess = self._sessions.get(session_id)
        if sess is None or sess.state == "active":
            raise ValueError(f"no ended session {session_id!r}")
        sess.state = "compacted"
        op = _Op()
        op.touched[session_id] = sess
        await self._submit(op)

    async def list_sessions(self) -> list[dict[str, Any]]:
        """Every session of this client, oldest first (ties in the order they started)."""
        await self._wait_ready()
        return [self._info(s) for s in sorted(self._sessions.values(), key=lambda s: s.started)]

    def conversation_ids(self) -> dict[tuple[str, int], str]:
        """(session_id, conversation number) -> MCP conversation id, for every mcp one."""
        return {
            (c.session_id, c.number): c.external_id
            for c in self._by_external.values()
            if c.session_id is not None and c.external_id is not None
        }

    async def erase(
        self, cuts: Mapping[str, set[tuple[int, int]]], files_lock: threading.Lock | None = None
    ) -> Erased:
        """Cut exchanges out of files and state for `memory.forget` (memd.sessions.erase).

        Record calls wait while it runs (one rewrite per file); whatever was decided before
        is committed first, and memory is rebuilt from the state afterwards.
        """
        return await self._paused(erase, self._disk, cuts, files_lock)

    async def resync(self) -> None:
        """Read the state again after files moved behind its back (a summary dropped, a
        transcript brought back from archive/): each session's state follows its file."""
        await self._paused(None)

    async def _paused(self, fn: Callable[..., Any] | None, *args: Any) -> Any:
        await self._wait_ready()
        self._ready.clear()
        try:
            await self._committer.submit(Change(), [])  # barrier: decided means on disk
            return await self._committer.io(fn, *args) if fn is not None else None
        finally:
            await self._committer.io(self._disk.close)
            await self._reload()

    def active_session(self) -> dict[str, Any] | None:
        """The current session (where new conversations go), or None."""
        return self._info(self._current) if self._current else None

    def active_sessions(self) -> list[dict[str, Any]]:
        """Every active session, the current one and resumed ones, oldest first."""
        return [self._info(s) for s in sorted(self._active.values(), key=lambda s: s.started)]

    def _info(self, sess: _Session) -> dict[str, Any]:
        path = (
            self.layout.archive_file(sess.session_id)
            if sess.state == "compacted"
            else self.layout.session_file(sess.session_id)
        )
        info = {
            "client_id": self.client_id,
            "session_id": sess.session_id,
            "state": sess.state,
            "started": transcript.iso(sess.started),
            "last_activity": transcript.iso(sess.last_activity),
            "ended": transcript.iso(sess.ended) if sess.ended is not None else None,
            "end_reason": sess.end_reason,
            "path": str(path),
            "conversations": sess.conversations,
            "resumed": transcript.iso(sess.resumed) if sess.resumed is not None else None,
            "resumes": sess.resumes,
        }
        if sess.state == "active":
            info["expires"] = transcript.iso(self._deadline(sess)[0])
        return info

    # --- writer, hooks, IO ---------------------------------------------------------------

    async def _submit(self, op: _Op, *, wait_hooks: bool = False) -> None:
        """Hand the op to the writer; return once it is on disk (and, if asked, hooks ran)."""
        change = Change(
            session_rows=[s.row() for s in op.touched.values()],
            conv_rows=[c.row() for c in op.convs.values()],
            nodes=op.nodes,
            keys=op.keys,
            reopen=op.reopen,
        )
        if op.text and op.session is not None:
            s = op.session
            header = transcript.front_matter(self.client_id, s.session_id, s.started)
            change.write = (s.session_id, "".join(op.text).encode("utf-8"), header.encode("utf-8"))
        await self._committer.submit(change, op.events, wait_hooks=wait_hooks)

    def _hooks(self, kind: str) -> Sequence[Hook]:
        return self.on_end if kind == "end" else self.on_resume

    async def _after_failure(self, exc: Exception) -> None:
        """A write failed: what was decided is void; rebuild memory from the committed state.

        If that fails too, the store is marked broken instead of staying unready: calls
        then fail fast (and retry the reload) rather than wait for ever.
        """
        self._ready.clear()
        await self._committer.io(self._disk.close)
        try:
            await self._reload()
        except Exception as reload_exc:
            self._broken = reload_exc
            self._ready.set()  # waiters wake up and see the broken store
            raise

    async def _reload(self) -> None:
        self._ready.clear()
        loaded = await self._committer.io(self._disk.open)
        self._sessions = {s.session_id: s for s in loaded.sessions}
        self._active = {s.session_id: s for s in loaded.sessions if s.state == "active"}
        fresh = [s for s in self._active.values() if s.resumed is None]
        self._current = fresh[-1] if fresh else None  # loaded oldest first
        for c in loaded.convs:  # rows written before titles were cut when set
            c.title = _title(c.title)
        self._convs = {c.key: c for c in loaded.convs}
        self._next_conv = max(self._convs, default=0)
        self._by_external = {
            c.external_id: c for c in loaded.convs if c.kind == "mcp" and c.external_id is not None
        }
        self._index = chat.PrefixIndex(store=loaded.reader, capacity=self._index_capacity)
        self._keys = ExchangeKeys(store=loaded.reader, capacity=self._index_capacity)
        self._ready.set()

    async def _wait_ready(self) -> None:
        if not self._committer.running:
            raise StorageError("session store is not open")
        await self._ready.wait()
        if self._broken is not None:
            await self._retry_reload()

    async def _retry_reload(self) -> None:
        """One caller at a time tries to reopen the state; the others get its verdict."""
        async with self._reload_lock:
            if self._broken is None:
                return
            try:
                # Touch the database only once the disk takes writes again: reopening
                # sqlite over and over on a failing filesystem gains nothing.
                await self._committer.io(_probe_writable, self.layout.tmp_dir)
                await self._committer.io(self._disk.close)
                await self._reload()
            except Exception as exc:
                self._broken = exc
                self._ready.set()
                raise StorageError(
                    f"could not record: the session store cannot be reopened: {exc}"
                ) from exc
            self._broken = None
            log.info("sessions.store_reopened", client=self.client_id)


def _probe_writable(folder: Path) -> None:
    """Create, fsync and remove a small file: raises OSError while the disk refuses writes."""
    fd, name = tempfile.mkstemp(dir=folder, prefix="probe.", suffix=".tmp")
    try:
        os.write(fd, b"memd")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(name)


def _exchange_parts(user: Any, assistant: Any, index_chars: int | None) -> tuple[list[Part], str]:
    """The exchange's two parts, checked and cleaned, and their markdown (pure: may run
    in a thread before the call decides anything)."""
    parts = [
        Part("User", chat.require_text(user, "user")),
        Part("Assistant", chat.require_text(assistant, "assistant")),
    ]
    return parts, transcript.parts_block(parts, index_chars)


def _title(text: str | None) -> str | None:
    """A conversation's title as its headings show it (one line, at most 70 characters).

    Cut when it is set, not when it is rendered: memd keeps every conversation in memory,
    and a first message can be megabytes long.
    """
    return None if text is None else transcript.conversation_title(text)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
