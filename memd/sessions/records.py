"""The rows of one client's session state and its read-only lookups (memd.sessions.store).

`Session` and `Conv` are the rows the book (memd.sessions.book) keeps in memory and
the store writes; `Change` is what one record call commits; `Loaded` is what opening the
store reads back; `StateReader` answers point lookups of what memory no longer holds.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.sessions import chat
from memd.sessions.exchange_keys import KeyRow
from memd.sessions.states import SessionState, check_transition

CACHE_KIB = 256  # sqlite page cache per client state database (default 2,000)


@dataclass(slots=True)
class Session:
    """One session row. `resumed` is set when an ended session was reopened (last time)."""

    session_id: str
    state: SessionState  # changed only by move(), which checks the transition
    started: float
    last_activity: float
    ended: float | None = None
    end_reason: str | None = None
    conversations: int = 0
    last_conv: int | None = None  # the conversation written last: a header is due on change
    resumed: float | None = None
    resumes: int = 0
    size: int = 0  # committed bytes (the store's business)
    tail: bytes | None = None

    def __post_init__(self) -> None:
        self.state = SessionState(self.state)  # a row read back holds the value (a str)

    def move(self, new: SessionState) -> SessionState:
        """Change state as memd.sessions.states allows; returns the old one."""
        old = self.state
        check_transition(self.session_id, old, new)
        self.state = new
        return old

    def row(self) -> tuple[Any, ...]:
        return (
            self.session_id,
            self.state,
            self.started,
            self.last_activity,
            self.ended,
            self.end_reason,
            self.conversations,
            self.last_conv,
            self.resumed,
            self.resumes,
        )


@dataclass(slots=True)
class Conv:
    """One conversation row: where its latest section is, and its title.

    `title` is the conversation's first user message (None: not known, e.g. a
    conversation recorded before titles existed); every exchange heading carries it.
    """

    key: int
    kind: str  # "mcp" | "chat"
    external_id: str | None
    session_id: str | None
    number: int = 0  # its number in that session
    exchanges: int = 0
    last_active: float = 0.0
    title: str | None = None

    def row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)  # _CONV_COLUMNS' order


@dataclass
class Change:
    """What one record call commits: transcript bytes, rows, and a session to reopen."""

    write: tuple[str, bytes, bytes] | None = None  # session id, data, front matter
    session_rows: list[tuple[Any, ...]] = field(default_factory=list)
    conv_rows: list[tuple[Any, ...]] = field(default_factory=list)
    nodes: list[chat.Node] = field(default_factory=list)
    keys: list[KeyRow] = field(default_factory=list)  # record_exchange's exchange_ids
    reopen: str | None = None  # a resumed session: its file is brought back and measured
    redacted: Mapping[str, int] = field(default_factory=dict)  # by kind (counts only)


@dataclass
class Loaded:
    sessions: list[Session]
    convs: list[Conv]
    reader: StateReader  # nodes and exchange keys stay on disk; memory keeps recent ones


class StateReader:
    """Point lookups of committed prefix-index nodes and exchange keys, for chat.PrefixIndex
    and exchange_keys.ExchangeKeys on the event loop.

    Its own read-only connection: in WAL mode it sees every committed transaction and never
    blocks the IO thread's writer. One lookup is an index probe (tens of microseconds).

    Every lookup goes through one cursor: `Connection.execute` makes a cursor per call, and
    Python 3.11's sqlite3 keeps a weak reference to each in a list it prunes only every 200
    cursors. After bench/load.py those dead references, ~1,900 across the clients'
    connections, were the most common object in the pymalloc arenas the load had grown
    (issue 29, docs/performance.md, "memd after load, round 6"; other objects keep those
    arenas too, so memd's size did not change). Each lookup reads its rows to the end, so
    the statement is reset and no read transaction stays open to hold the WAL back.
    """

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        self._db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        self._cursor = self._db.cursor()
        self._lock = threading.Lock()  # one cursor: one lookup at a time

    def _first(self, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._lock:
            rows = self._cursor.execute(sql, args).fetchall()
        return rows[0] if rows else None  # a row is a tuple already

    def node(self, h: bytes) -> tuple[int, int] | None:
        row = self._first("SELECT conv, exchange FROM nodes WHERE hash = ?", (h,))
        return (row[0], row[1]) if row else None

    def has_children(self, h: bytes) -> bool:
        return self._first("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (h,)) is not None

    def exchange_key(self, conv: int, exchange_id: str) -> tuple[bytes, str, int] | None:
        row = self._first(
            "SELECT digest, session_id, number FROM exchange_keys "
            "WHERE conv = ? AND exchange_id = ?",
            (conv, exchange_id),
        )
        return (row[0], row[1], row[2]) if row else None

    def shrink(self) -> None:
        """Give back the connection's page cache (StateStore.shrink)."""
        self._first("PRAGMA shrink_memory", ())

    def close(self) -> None:
        self._db.close()
