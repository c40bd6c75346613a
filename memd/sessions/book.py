"""One client's sessions and conversations in memory, and the rules that change them.

`SessionBook` is plain synchronous state: no IO besides checking that a new session id
names no file yet, no threads, no awaits. `ClientSessions` (memd.sessions.tracker)
changes it only while it holds its decision lock, so every rule below sees one
consistent state; each change is recorded in an `Op`, which becomes the `Change` the
committer writes and the events its hooks hear of.

Sessions end once `now >= min(last_activity + inactivity, (resumed or started) +
max_duration)`, at that deadline, not when it is noticed. The *current* session is the
active one started fresh, where new conversations go; resumed ones take only their own
conversations.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.sessions import chat
from memd.sessions.events import SessionEvent, SessionInfo
from memd.sessions.exchange_keys import ExchangeKeys, KeyRow
from memd.sessions.states import SessionState
from memd.sessions.store import Change, Conv, Loaded, Session

log = structlog.get_logger()

ACTIVE, ENDED, COMPACTED = SessionState.ACTIVE, SessionState.ENDED, SessionState.COMPACTED


@dataclass
class Op:
    """What one call decided: bytes for one transcript, state rows, events for hooks."""

    session: Session | None = None
    text: list[str] = field(default_factory=list)
    touched: dict[str, Session] = field(default_factory=dict)
    convs: dict[int, Conv] = field(default_factory=dict)
    nodes: list[chat.Node] = field(default_factory=list)
    keys: list[KeyRow] = field(default_factory=list)
    events: list[SessionEvent] = field(default_factory=list)
    reopen: str | None = None
    redacted: Counter[str] = field(default_factory=Counter)  # by kind, in `text`

    def ended(self) -> list[SessionInfo]:
        return [e.info for e in self.events if e.kind == "end"]


class SessionBook:
    """The state of one client's sessions, conversations, prefix index and exchange keys."""

    def __init__(self, layout: ClientLayout) -> None:
        self.layout = layout
        self.client_id = layout.client_id
        self.inactivity = 180.0 * 60
        self.max_duration = 480.0 * 60
        self.sessions: dict[str, Session] = {}
        self.active: dict[str, Session] = {}
        self.current: Session | None = None  # the active session started fresh
        self.convs: dict[int, Conv] = {}
        self.next_conv = 0
        self.by_external: dict[str, Conv] = {}
        self.index = chat.PrefixIndex()
        self.keys = ExchangeKeys()

    def load(self, loaded: Loaded, capacity: int) -> None:
        """Take the committed state (at open, and after a failed write voided decisions)."""
        self.sessions = {s.session_id: s for s in loaded.sessions}
        self.active = {s.session_id: s for s in loaded.sessions if s.state == ACTIVE}
        fresh = [s for s in self.active.values() if s.resumed is None]
        self.current = fresh[-1] if fresh else None  # loaded oldest first
        for c in loaded.convs:  # rows written before titles were cut when set
            c.title = title_of(c.title)
        self.convs = {c.key: c for c in loaded.convs}
        self.next_conv = max(self.convs, default=0)
        self.by_external = {
            c.external_id: c for c in loaded.convs if c.kind == "mcp" and c.external_id is not None
        }
        self.index = chat.PrefixIndex(store=loaded.reader, capacity=capacity)
        self.keys = ExchangeKeys(store=loaded.reader, capacity=capacity)

    # --- which session a write goes to ---------------------------------------------------

    def target(self, conv: Conv | None, now: float, op: Op) -> Session | None:
        """The session a conversation's next write goes to; None: reopen its session first."""
        sess = self.sessions.get(conv.session_id) if conv and conv.session_id else None
        if sess is None:
            return self.current_for_write(now, op)
        if sess.state != ACTIVE:
            return None
        deadline, reason = self.deadline(sess)
        if now >= deadline:
            # Its time was up but no monitor had noticed: it ends at its deadline and its
            # own conversation reopens it at once. Nothing left sessions/: no hooks.
            self.end(sess, deadline, reason, op, quiet=True)
            self.resume(sess, now, op)
        return sess

    def current_for_write(self, now: float, op: Op) -> Session:
        """The current session, after ending it if its time is up; a new one if none."""
        if self.current is not None:
            self.end_if_due(self.current, now, op)
        if self.current is None:
            sid = transcript.new_session_id(now)
            while (
                sid in self.sessions
                or self.layout.session_file(sid).exists()
                or self.layout.archive_file(sid).exists()
            ):
                sid = transcript.new_session_id(now)
            sess = self.sessions[sid] = Session(sid, ACTIVE, now, now)
            self.active[sid] = self.current = sess
            log.info("session.started", client=self.client_id, session=sid)
        return self.current

    # --- state changes -------------------------------------------------------------------

    def resume(self, sess: Session, now: float, op: Op) -> None:
        old = sess.move(ACTIVE)
        sess.ended, sess.end_reason = None, None
        sess.resumed, sess.resumes = now, sess.resumes + 1
        sess.last_activity = max(sess.last_activity, now)
        self.active[sess.session_id] = sess
        op.touched[sess.session_id] = sess
        op.events.append(SessionEvent("resume", {**self.info(sess), "old_state": str(old)}))
        log.info(
            "session.resumed",
            client=self.client_id,
            session=sess.session_id,
            old_state=str(old),
            resumes=sess.resumes,
        )

    def deadline(self, sess: Session) -> tuple[float, str]:
        idle = sess.last_activity + self.inactivity
        longest = (sess.started if sess.resumed is None else sess.resumed) + self.max_duration
        return (idle, "inactivity") if idle <= longest else (longest, "max_duration")

    def end_if_due(self, sess: Session, now: float, op: Op) -> bool:
        deadline, reason = self.deadline(sess)
        if now < deadline:
            return False
        self.end(sess, deadline, reason, op)
        return True

    def end(self, sess: Session, at: float, reason: str, op: Op, *, quiet: bool = False) -> None:
        sess.move(ENDED)
        sess.ended, sess.end_reason = at, reason
        self.active.pop(sess.session_id, None)
        if self.current is sess:
            self.current = None
        op.touched[sess.session_id] = sess
        if not quiet:
            op.events.append(SessionEvent("end", self.info(sess)))
        log.info("session.ended", client=self.client_id, session=sess.session_id, reason=reason)

    def compacted(self, session_id: str, op: Op) -> None:
        sess = self.sessions.get(session_id)
        if sess is None or sess.state == ACTIVE:
            raise ValueError(f"no ended session {session_id!r}")
        if sess.state != COMPACTED:
            sess.move(COMPACTED)
        op.touched[session_id] = sess

    # --- conversations -------------------------------------------------------------------

    def new_conv(self, kind: str, external_id: str | None) -> Conv:
        self.next_conv += 1
        conv = Conv(self.next_conv, kind, external_id, None)
        self.convs[conv.key] = conv
        return conv

    def header_if_due(self, sess: Session, conv: Conv, stamp: datetime) -> str:
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

    def append(self, op: Op, sess: Session, conv: Conv, now: float, text: str) -> None:
        op.session = sess
        op.text.append(text)
        self.touch(op, sess, conv, now)

    def touch(self, op: Op, sess: Session, conv: Conv, now: float) -> None:
        sess.last_activity = max(sess.last_activity, now)
        conv.last_active = now
        op.touched[sess.session_id] = sess
        op.convs[conv.key] = conv

    # --- what goes out -------------------------------------------------------------------

    def saved(self, op: Op) -> None:
        """The op's change is on disk: its nodes and keys may leave memory."""
        self.index.saved(op.nodes)
        self.keys.saved(op.keys)

    def change(self, op: Op) -> Change:
        """The rows and bytes an op commits."""
        change = Change(
            session_rows=[s.row() for s in op.touched.values()],
            conv_rows=[c.row() for c in op.convs.values()],
            nodes=op.nodes,
            keys=op.keys,
            reopen=op.reopen,
            redacted=op.redacted,
        )
        if op.text and op.session is not None:
            s = op.session
            header = transcript.front_matter(self.client_id, s.session_id, s.started)
            change.write = (s.session_id, "".join(op.text).encode("utf-8"), header.encode("utf-8"))
        return change

    def info(self, sess: Session) -> SessionInfo:
        path = (
            self.layout.archive_file(sess.session_id)
            if sess.state == COMPACTED
            else self.layout.session_file(sess.session_id)
        )
        info: SessionInfo = {
            "client_id": self.client_id,
            "session_id": sess.session_id,
            "state": str(sess.state),
            "started": transcript.iso(sess.started),
            "last_activity": transcript.iso(sess.last_activity),
            "ended": transcript.iso(sess.ended) if sess.ended is not None else None,
            "end_reason": sess.end_reason,
            "path": str(path),
            "conversations": sess.conversations,
            "resumed": transcript.iso(sess.resumed) if sess.resumed is not None else None,
            "resumes": sess.resumes,
        }
        if sess.state == ACTIVE:
            info["expires"] = transcript.iso(self.deadline(sess)[0])
        return info


def title_of(text: str | None) -> str | None:
    """A conversation's title as its headings show it (one line, at most 70 characters).

    Cut when it is set, not when it is rendered: memd keeps every conversation in memory,
    and a first message can be megabytes long.
    """
    return None if text is None else transcript.conversation_title(text)
