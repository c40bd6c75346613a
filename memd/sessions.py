"""One client's sessions and conversations: recording, prefix matching, expiry, durable state.

Sessions. A session starts with the first write when the client has none active and
ends once `now >= min(last_activity + inactivity, started + max_duration)`: checked by
`expire(now)` (the daemon's monitor) and by every record call, so a late monitor never
lets a session run long. A session ends at that deadline, not when it is noticed.
Timestamps passed for imports only label exchanges; session timing follows the clock.

Conversations. `mcp_via_llm`: one per MCP session id (`conversation_id`). `both`: the
longest recorded prefix of the request decides continuation, regenerate, edit or a new
conversation (chat.PrefixIndex documents the rules and their cost).

Continuations across sessions. A conversation whose session has ended (or been
compacted) continues in the client's current session (started if needed) under
`# Conversation N (<time>, continued from <old session id>)`; its mapping moves there,
and `on_resume` hooks hear about it (compaction may re-compact the old session).

Durability. Record calls decide synchronously on the event loop (so decisions never
interleave) and queue the bytes; one writer per client takes everything queued,
appends it to the transcript with one write and one fsync, then commits the state to
`<root>/.memd/state.sqlite3` (WAL, synchronous=FULL), and only then answers the callers
(group commit). The state records each transcript's committed size; on open, a
transcript longer than that ends in bytes no caller was told about and is cut back
(transcript.reconcile), and a session file that never reached the state is removed.
So after kill -9 or power loss the file and the state agree, and every acknowledged
exchange is in the file exactly once.
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from memd import chat, transcript
from memd.errors import StorageError
from memd.layout import ClientLayout
from memd.transcript import Part

log = structlog.get_logger()

Hook = Callable[[dict[str, Any]], Awaitable[None] | None]
OFFLOAD_MESSAGES = 256  # hash bigger requests in a thread, off the event loop

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, state TEXT NOT NULL, started REAL NOT NULL,
    last_activity REAL NOT NULL, ended REAL, end_reason TEXT,
    conversations INTEGER NOT NULL, last_conv INTEGER,
    size INTEGER NOT NULL DEFAULT 0, tail BLOB);
CREATE TABLE IF NOT EXISTS conversations (
    conv INTEGER PRIMARY KEY, kind TEXT NOT NULL, external_id TEXT, session_id TEXT,
    number INTEGER NOT NULL, exchanges INTEGER NOT NULL, last_active REAL NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    hash BLOB PRIMARY KEY, conv INTEGER NOT NULL, exchange INTEGER NOT NULL, parent BLOB
) WITHOUT ROWID;
"""
_UPSERT_SESSION = """
INSERT INTO sessions (session_id, state, started, last_activity, ended, end_reason,
                      conversations, last_conv) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (session_id) DO UPDATE SET state = excluded.state, started = excluded.started,
    last_activity = excluded.last_activity, ended = excluded.ended,
    end_reason = excluded.end_reason, conversations = excluded.conversations,
    last_conv = excluded.last_conv
"""


@dataclass(slots=True)
class _Session:
    session_id: str
    state: str  # active | ended | compacted
    started: float
    last_activity: float
    ended: float | None = None
    end_reason: str | None = None
    conversations: int = 0
    last_conv: int | None = None  # the conversation written last: a header is due on change
    size: int = 0  # committed bytes (the writer's business)
    tail: bytes | None = None

    def row(self) -> tuple[Any, ...]:
        return (self.session_id, self.state, self.started, self.last_activity, self.ended,
                self.end_reason, self.conversations, self.last_conv)


@dataclass(slots=True)
class _Conv:
    key: int
    kind: str  # "mcp" | "chat"
    external_id: str | None
    session_id: str | None  # where its latest section is
    number: int = 0  # its number in that session
    exchanges: int = 0
    last_active: float = 0.0

    def row(self) -> tuple[Any, ...]:
        return (self.key, self.kind, self.external_id, self.session_id, self.number,
                self.exchanges, self.last_active)


@dataclass
class _Op:
    """What one call decided: bytes for one transcript, state rows, events for hooks."""

    session: _Session | None = None
    text: list[str] = field(default_factory=list)
    touched: dict[str, _Session] = field(default_factory=dict)
    convs: dict[int, _Conv] = field(default_factory=dict)
    nodes: list[chat.Node] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # filled by _submit:
    write: tuple[str, bytes, bytes] | None = None  # session id, data, front matter
    session_rows: list[tuple[Any, ...]] = field(default_factory=list)
    conv_rows: list[tuple[Any, ...]] = field(default_factory=list)
    future: asyncio.Future[None] | None = None
    hooks_done: asyncio.Future[None] | None = None


@dataclass
class _Loaded:
    sessions: list[_Session]
    convs: list[_Conv]
    nodes: list[chat.Node]


class _Disk:
    """The client's files and sqlite state; used only from the client's one IO thread."""

    def __init__(self, layout: ClientLayout) -> None:
        self.layout = layout
        self.db: sqlite3.Connection | None = None
        self.files: dict[str, transcript.AppendFile] = {}

    def open(self) -> _Loaded:
        self.layout.ensure()
        path = self.layout.state_dir / "state.sqlite3"
        fresh = not path.exists()
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before a caller hears "recorded"; with NORMAL a power
        # loss could lose a commit whose transcript bytes survived, and recovery would
        # then cut an acknowledged exchange.
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        self.db = db
        loaded = self._load()
        self._recover(loaded, fresh)
        return loaded

    def _load(self) -> _Loaded:
        assert self.db is not None
        sessions = [
            _Session(*row) for row in self.db.execute(
                "SELECT session_id, state, started, last_activity, ended, end_reason,"
                " conversations, last_conv, size, tail FROM sessions ORDER BY started, rowid")
        ]
        convs = [_Conv(*row) for row in self.db.execute(
            "SELECT conv, kind, external_id, session_id, number, exchanges, last_active"
            " FROM conversations")]
        nodes = self.db.execute("SELECT hash, conv, exchange, parent FROM nodes").fetchall()
        return _Loaded(sessions, convs, nodes)

    def _recover(self, loaded: _Loaded, fresh: bool) -> None:
        """Make transcripts agree with the committed state after a crash (see module doc)."""
        known = {s.session_id for s in loaded.sessions}
        for s in loaded.sessions:
            if s.state == "active":
                outcome = transcript.reconcile(self.layout.session_file(s.session_id),
                                               s.size, s.tail)
                if outcome == "shorter":
                    s.size = self.layout.session_file(s.session_id).stat().st_size
        if fresh:
            return  # a lost state database must never cost the user their transcripts
        newest = max(known, default="")
        for path in sorted(self.layout.sessions.glob("*.md")):
            if path.stem not in known and path.stem > newest and \
                    transcript.is_orphan(path, self.layout.client_id):
                path.unlink()
                transcript.fsync_dir(path.parent)
                log.info("unacknowledged session file removed", client=self.layout.client_id,
                         path=str(path))

    def commit(self, batch: Sequence[_Op]) -> None:
        """Append each transcript's share of the batch (one write + fsync), then commit state."""
        writes: dict[str, tuple[bytes, list[bytes]]] = {}
        for op in batch:
            if op.write:
                sid, data, header = op.write
                writes.setdefault(sid, (header, []))[1].append(data)
        sizes: list[tuple[int, bytes, str]] = []
        for sid, (header, chunks) in writes.items():
            f = self.files.get(sid)
            if f is None:
                f = self.files[sid] = transcript.AppendFile(self.layout.session_file(sid))
            size, digest = f.append(b"".join(chunks), header)
            sizes.append((size, digest, sid))
        self._commit_state(batch, sizes)
        for op in batch:
            for row in op.session_rows:
                if row[1] != "active" and row[0] in self.files:
                    self.files.pop(row[0]).close()

    def _commit_state(self, batch: Sequence[_Op], sizes: list[tuple[int, bytes, str]]) -> None:
        assert self.db is not None
        db = self.db
        db.execute("BEGIN")
        try:
            for op in batch:
                db.executemany(_UPSERT_SESSION, op.session_rows)
                db.executemany("INSERT OR REPLACE INTO conversations VALUES (?,?,?,?,?,?,?)",
                               op.conv_rows)
                db.executemany("INSERT OR REPLACE INTO nodes VALUES (?,?,?,?)", op.nodes)
            db.executemany("UPDATE sessions SET size = ?, tail = ? WHERE session_id = ?", sizes)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
        if self.db is not None:
            self.db.close()
            self.db = None


class ClientSessions:
    """Sessions and conversations of one client. Use `async with` or open()/close().

    All methods are coroutines for the daemon's event loop; file and sqlite work runs in
    this client's own IO thread. `clock` returns epoch seconds (tests pass a fake one).
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
    ) -> None:
        self.layout = layout
        self.client_id = layout.client_id
        self.on_end: list[Hook] = list(on_end)
        self.on_resume: list[Hook] = list(on_resume)
        self._clock = clock
        self.set_limits(inactivity_minutes, max_minutes)
        self._disk = _Disk(layout)
        self._executor: ThreadPoolExecutor | None = None
        self._sessions: dict[str, _Session] = {}
        self._active: _Session | None = None
        self._convs: dict[int, _Conv] = {}
        self._next_conv = 0
        self._by_external: dict[str, _Conv] = {}
        self._index = chat.PrefixIndex()
        self._queue: list[_Op] = []
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._closing = False
        self._hook_queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> ClientSessions:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"memd-{self.client_id}")
        await self._reload()
        self._tasks = [asyncio.create_task(self._writer(), name=f"writer:{self.client_id}"),
                       asyncio.create_task(self._hook_runner(), name=f"hooks:{self.client_id}")]
        return self

    async def close(self) -> None:
        """Finish queued writes and hooks, then release files and the database."""
        if self._executor is None:
            return
        self._closing = True
        self._wake.set()
        await self._tasks[0]
        await self._hook_queue.put(("stop", None))
        await self._tasks[1]
        await self._io(self._disk.close)
        self._executor.shutdown()
        self._executor = None

    async def __aenter__(self) -> ClientSessions:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_limits(self, inactivity_minutes: float, max_minutes: float) -> None:
        """New timeouts (config reload); they apply at the next check."""
        if not inactivity_minutes > 0 or not max_minutes > 0:
            raise ValueError("session limits must be positive minutes")
        self._inactivity = float(inactivity_minutes) * 60.0
        self._max = float(max_minutes) * 60.0

    # --- recording -----------------------------------------------------------------------

    async def record_exchange(self, conversation_id: Any, user: Any, assistant: Any,
                              timestamp: Any = None) -> dict[str, Any]:
        """mcp_via_llm: append one user/assistant exchange to conversation `conversation_id`."""
        chat.check_conversation_id(conversation_id)
        parts = [Part("User", chat.require_text(user, "user")),
                 Part("Assistant", chat.require_text(assistant, "assistant"))]
        when = chat.parse_timestamp(timestamp)
        await self._wait_ready()
        now, op = self._clock(), _Op()
        sess = self._session_for_write(now, op)
        conv = self._by_external.get(conversation_id)
        if conv is None:
            conv = self._by_external[conversation_id] = self._new_conv("mcp", conversation_id)
        stamp = when or _dt(now)
        header = self._header_if_due(sess, conv, stamp, op)
        conv.exchanges += 1
        self._append(op, sess, conv, now,
                     header + transcript.exchange_block(conv.exchanges, stamp, parts))
        await self._submit(op)
        return {"session_id": sess.session_id, "conversation": conv.number,
                "path": str(self.layout.session_file(sess.session_id))}

    async def record_chat(self, messages: Any, response: Any,
                          timestamp: Any = None) -> dict[str, Any]:
        """both: record an OpenAI chat call (the messages sent and the reply); see module doc."""
        when = chat.parse_timestamp(timestamp)
        if isinstance(messages, list) and len(messages) > OFFLOAD_MESSAGES:
            msgs, resp, hashes = await asyncio.to_thread(chat.prepare, messages, response)
        else:
            msgs, resp, hashes = chat.prepare(messages, response)
        await self._wait_ready()
        now, op = self._clock(), _Op()
        k, kind, key, ref = self._index.classify(msgs, hashes)
        conv = self._convs[key] if key is not None else None
        if kind == "duplicate":
            assert conv is not None
            if self._active and conv.session_id == self._active.session_id:
                self._touch(op, self._active, conv, now)
            await self._submit(op)
            return self._chat_result(conv, kind, 0)
        sess = self._session_for_write(now, op)
        if conv is None:
            conv = self._new_conv("chat", None)
        stamp = when or _dt(now)
        header = self._header_if_due(sess, conv, stamp, op)
        new = [*msgs[k:], resp]
        note = {"regenerated": f"regenerated reply to exchange {ref}",
                "edited": f"edited, branches after exchange {ref}",
                "branch": f"branch after exchange {ref}"}.get(kind, "")
        join_open = kind == "continuation" and not header and ref == conv.exchanges
        text, numbers = self._render(conv, new, stamp, note,
                                     preamble=kind == "new", join_open=join_open)
        op.nodes = self._index.add(hashes, k, numbers, conv.key)
        self._append(op, sess, conv, now, header + text)
        await self._submit(op)
        return self._chat_result(conv, kind, len(new))

    def _render(self, conv: _Conv, new: list[chat.Message], stamp: datetime, note: str,
                *, preamble: bool, join_open: bool) -> tuple[str, list[int]]:
        """Markdown for new messages, one `##` exchange per user turn; exchange of each.

        A new conversation's leading system/developer prompts go under its header.
        With `join_open`, leading non-user messages (tool results, a continued reply)
        join the exchange written last, so one turn stays in one chunk.
        """
        out: list[str] = []
        numbers: list[int] = []
        i = 0
        while preamble and new[i].role in chat.PREAMBLE_ROLES:  # the reply always ends it
            out.append(transcript.parts_block(new[i].parts))
            numbers.append(0)
            i += 1
        while join_open and i < len(new) and new[i].role != "user":
            out.append(transcript.parts_block(new[i].parts))
            numbers.append(conv.exchanges)
            i += 1
        group: list[Part] = []
        talked = False
        for message in new[i:]:
            if message.role == "user" and talked:
                conv.exchanges += 1
                out.append(transcript.exchange_block(conv.exchanges, stamp, group, note))
                note, group, talked = "", [], False
            talked = talked or message.role in ("user", "assistant")
            group.extend(message.parts)
            numbers.append(conv.exchanges + 1)
        if group:
            conv.exchanges += 1
            out.append(transcript.exchange_block(conv.exchanges, stamp, group, note))
        return "".join(out), numbers

    def _chat_result(self, conv: _Conv, kind: str, appended: int) -> dict[str, Any]:
        sid = conv.session_id or ""
        return {"session_id": sid, "conversation": conv.number,
                "new_conversation": kind == "new", "appended": appended, "match": kind,
                "path": str(self.layout.session_file(sid)) if sid else ""}

    # --- sessions ------------------------------------------------------------------------

    def _session_for_write(self, now: float, op: _Op) -> _Session:
        """The active session, after ending it if its time is up; a new one if none."""
        if self._active is not None:
            self._end_if_due(self._active, now, op)
        if self._active is None:
            sid = transcript.new_session_id(now)
            while sid in self._sessions or self.layout.session_file(sid).exists() \
                    or self.layout.archive_file(sid).exists():
                sid = transcript.new_session_id(now)
            sess = self._sessions[sid] = _Session(sid, "active", now, now)
            self._active = sess
            log.info("session started", client=self.client_id, session=sid)
        op.session = self._active
        return self._active

    def _deadline(self, sess: _Session) -> tuple[float, str]:
        idle = sess.last_activity + self._inactivity
        longest = sess.started + self._max
        return (idle, "inactivity") if idle <= longest else (longest, "max_duration")

    def _end_if_due(self, sess: _Session, now: float, op: _Op) -> bool:
        deadline, reason = self._deadline(sess)
        if now < deadline:
            return False
        self._end(sess, deadline, reason, op)
        return True

    def _end(self, sess: _Session, at: float, reason: str, op: _Op) -> None:
        sess.state, sess.ended, sess.end_reason = "ended", at, reason
        self._active = None
        op.touched[sess.session_id] = sess
        op.events.append(("end", self._info(sess)))
        log.info("session ended", client=self.client_id, session=sess.session_id, reason=reason)

    def _new_conv(self, kind: str, external_id: str | None) -> _Conv:
        self._next_conv += 1
        conv = _Conv(self._next_conv, kind, external_id, None)
        self._convs[conv.key] = conv
        return conv

    def _header_if_due(self, sess: _Session, conv: _Conv, stamp: datetime, op: _Op) -> str:
        """A conversation header when the file's last section belongs to another one."""
        if sess.last_conv == conv.key:
            return ""
        sess.last_conv = conv.key
        if conv.session_id == sess.session_id:
            return transcript.conversation_header(conv.number, stamp, "continued")
        old = conv.session_id
        sess.conversations += 1
        conv.session_id, conv.number = sess.session_id, sess.conversations
        if old is None:
            return transcript.conversation_header(conv.number, stamp)
        old_sess = self._sessions.get(old)
        op.events.append(("resume", {
            "client_id": self.client_id, "conversation": conv.number,
            "session_id": sess.session_id, "old_session_id": old,
            "old_state": old_sess.state if old_sess else "unknown"}))
        return transcript.conversation_header(conv.number, stamp, f"continued from {old}")

    def _append(self, op: _Op, sess: _Session, conv: _Conv, now: float, text: str) -> None:
        op.text.append(text)
        self._touch(op, sess, conv, now)

    def _touch(self, op: _Op, sess: _Session, conv: _Conv, now: float) -> None:
        sess.last_activity = max(sess.last_activity, now)
        conv.last_active = now
        op.touched[sess.session_id] = sess
        op.convs[conv.key] = conv

    # --- monitor and inspection ----------------------------------------------------------

    async def expire(self, now: float | None = None) -> list[dict[str, Any]]:
        """End the active session if its time is up; the monitor calls this periodically."""
        await self._wait_ready()
        now = self._clock() if now is None else now
        op = _Op()
        if self._active is None or not self._end_if_due(self._active, now, op):
            return []
        await self._submit(op, wait_hooks=True)
        return [info for kind, info in op.events if kind == "end"]

    async def close_active(self, now: float | None = None) -> dict[str, Any] | None:
        """End the active session now (sessions.close); None when there is none."""
        await self._wait_ready()
        if self._active is None:
            return None
        op = _Op()
        self._end(self._active, self._clock() if now is None else now, "closed", op)
        await self._submit(op, wait_hooks=True)
        return op.events[0][1]

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

    def active_session(self) -> dict[str, Any] | None:
        return self._info(self._active) if self._active else None

    def _info(self, sess: _Session) -> dict[str, Any]:
        path = (self.layout.archive_file(sess.session_id) if sess.state == "compacted"
                else self.layout.session_file(sess.session_id))
        info = {
            "client_id": self.client_id, "session_id": sess.session_id, "state": sess.state,
            "started": transcript.iso(sess.started),
            "last_activity": transcript.iso(sess.last_activity),
            "ended": transcript.iso(sess.ended) if sess.ended is not None else None,
            "end_reason": sess.end_reason, "path": str(path),
            "conversations": sess.conversations,
        }
        if sess.state == "active":
            info["expires"] = transcript.iso(self._deadline(sess)[0])
        return info

    # --- writer, hooks, IO ---------------------------------------------------------------

    async def _submit(self, op: _Op, *, wait_hooks: bool = False) -> None:
        """Queue the op for the writer and wait until it is on disk (and hooks ran)."""
        if self._closing or self._executor is None:
            raise StorageError("session store is closed")
        loop = asyncio.get_running_loop()
        if op.text and op.session is not None:
            s = op.session
            header = transcript.front_matter(self.client_id, s.session_id, s.started)
            op.write = (s.session_id, "".join(op.text).encode("utf-8"), header.encode("utf-8"))
        op.session_rows = [s.row() for s in op.touched.values()]
        op.conv_rows = [c.row() for c in op.convs.values()]
        op.future = loop.create_future()
        op.hooks_done = loop.create_future() if wait_hooks else None
        self._queue.append(op)
        self._wake.set()
        await asyncio.shield(op.future)
        if op.hooks_done is not None:
            await asyncio.shield(op.hooks_done)

    async def _writer(self) -> None:
        """Group commit: everything queued while the previous batch was syncing goes next."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._queue:
                if self._closing:
                    return
                continue
            batch, self._queue = self._queue, []
            try:
                await self._io(self._disk.commit, batch)
            except Exception as exc:
                await self._fail(batch, exc)
                continue
            for op in batch:
                for event in op.events:
                    self._hook_queue.put_nowait(event)
                if op.hooks_done is not None:
                    self._hook_queue.put_nowait(("done", op.hooks_done))
                _resolve(op.future)
            if self._queue or self._closing:
                self._wake.set()

    async def _fail(self, batch: list[_Op], exc: Exception) -> None:
        """A failed write: fail every decided op, then rebuild memory from the committed state."""
        self._ready.clear()
        failed, self._queue = batch + self._queue, []
        log.error("recording failed", client=self.client_id, error=str(exc), ops=len(failed))
        for op in failed:
            _resolve(op.future, StorageError(f"could not record: {exc}"))
            _resolve(op.hooks_done)
        try:
            await self._io(self._disk.close)
            await self._reload()
        except Exception as reload_exc:  # the store stays unready; calls wait for a restart
            log.error("reloading state failed", client=self.client_id, error=str(reload_exc))

    async def _reload(self) -> None:
        self._ready.clear()
        loaded = await self._io(self._disk.open)
        self._sessions = {s.session_id: s for s in loaded.sessions}
        actives = [s for s in loaded.sessions if s.state == "active"]
        self._active = actives[-1] if actives else None
        self._convs = {c.key: c for c in loaded.convs}
        self._next_conv = max(self._convs, default=0)
        self._by_external = {c.external_id: c for c in loaded.convs
                             if c.kind == "mcp" and c.external_id is not None}
        self._index = chat.PrefixIndex(loaded.nodes)
        self._ready.set()

    async def _wait_ready(self) -> None:
        if self._executor is None:
            raise StorageError("session store is not open")
        await self._ready.wait()

    async def _hook_runner(self) -> None:
        """Runs hooks in event order, off the writer's path; a failing hook is only logged."""
        while True:
            kind, payload = await self._hook_queue.get()
            if kind == "stop":
                return
            if kind == "done":
                _resolve(payload)
                continue
            for hook in self.on_end if kind == "end" else self.on_resume:
                try:
                    result = hook(payload)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("session hook failed", client=self.client_id,
                                  hook_event=kind, hook=getattr(hook, "__qualname__", repr(hook)))

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


def _resolve(future: asyncio.Future[None] | None, exc: BaseException | None = None) -> None:
    if future is None or future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
        future.add_done_callback(lambda f: f.exception())  # nobody may be waiting any more


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
