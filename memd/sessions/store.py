"""One client's session state on disk: schema, group-commit writer, transcript appends, recovery.

The batches come from memd.sessions.committer (group commit).

`StateStore` owns `<root>/.memd/state.sqlite3` (WAL, synchronous=FULL) and the open
transcript files, and is used only from the client's one IO thread (`ClientSessions`
runs it there). A commit appends each transcript's share of a batch with one write and
one fsync, then commits the state in one transaction: the rows the batch changed,
each written transcript's committed size and tail digest, and the exchange_ids of its
`record_exchange` calls (`memd.sessions.exchange_keys`: a key is durable exactly when its
exchange was acknowledged). On open, a transcript longer than its committed size ends
in bytes no caller was told about and is cut back (transcript.reconcile), a session file
that never reached the state is removed, and a session whose file was moved between
`sessions/` and `archive/` without the state hearing of it gets the state that matches
where the file is.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import structlog

from memd import trust
from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.redaction import truncate_wal
from memd.sessions import redactions, sealing
from memd.sessions.records import CACHE_KIB, Change, Conv, Loaded, Session, StateReader
from memd.sessions.states import SessionState
from memd.sessions.titles import Titles

log = structlog.get_logger()

STATE_FILE = "state.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, state TEXT NOT NULL, started REAL NOT NULL,
    last_activity REAL NOT NULL, ended REAL, end_reason TEXT,
    conversations INTEGER NOT NULL, last_conv INTEGER,
    size INTEGER NOT NULL DEFAULT 0, tail BLOB,
    resumed REAL, resumes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS conversations (
    conv INTEGER PRIMARY KEY, kind TEXT NOT NULL, external_id TEXT, session_id TEXT,
    number INTEGER NOT NULL, exchanges INTEGER NOT NULL, last_active REAL NOT NULL,
    title TEXT);
CREATE TABLE IF NOT EXISTS nodes (
    hash BLOB PRIMARY KEY, conv INTEGER NOT NULL, exchange INTEGER NOT NULL, parent BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent);
CREATE TABLE IF NOT EXISTS exchange_keys (
    conv INTEGER NOT NULL, exchange_id TEXT NOT NULL, digest BLOB NOT NULL,
    session_id TEXT NOT NULL, number INTEGER NOT NULL,
    PRIMARY KEY (conv, exchange_id)
) WITHOUT ROWID;
"""
# Tables added later need nothing more: the schema's CREATE TABLE IF NOT EXISTS runs on
# every open. Columns added after the first release: (table, name, definition).
_ADDED_COLUMNS = [
    ("sessions", "resumed", "REAL"),
    ("sessions", "resumes", "INTEGER NOT NULL DEFAULT 0"),
    ("conversations", "title", "TEXT"),
]
_CONV_COLUMNS = "conv, kind, external_id, session_id, number, exchanges, last_active, title"
_SESSION_COLUMNS = (
    "session_id, state, started, last_activity, ended, end_reason,"
    " conversations, last_conv, resumed, resumes, size, tail"
)
_UPSERT_SESSION = """
INSERT INTO sessions (session_id, state, started, last_activity, ended, end_reason,
                      conversations, last_conv, resumed, resumes)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (session_id) DO UPDATE SET state = excluded.state, started = excluded.started,
    last_activity = excluded.last_activity, ended = excluded.ended,
    end_reason = excluded.end_reason, conversations = excluded.conversations,
    last_conv = excluded.last_conv, resumed = excluded.resumed, resumes = excluded.resumes
"""


class StateStore:
    """The client's transcripts and sqlite state; used only from the client's one IO thread."""

    def __init__(self, layout: ClientLayout) -> None:
        self.layout = layout
        self.db: sqlite3.Connection | None = None
        self._cursor: sqlite3.Cursor | None = None  # the one every commit goes through
        self.reader: StateReader | None = None
        self.files: dict[str, transcript.AppendFile] = {}
        self.titles = Titles(())
        self.seal_key = b""  # the client's hash key (memd.sessions.sealing), read by open()
        self.redacted: dict[str, int] = {}  # secrets redacted so far, by kind

    def open(self) -> Loaded:
        self.layout.ensure()
        path = self.layout.state_dir / STATE_FILE
        # sqlite follows symlinks and makes WAL and SHM files beside the database: each
        # must be a regular file of ours (made 0600 if an older memd left it readable).
        for name in (STATE_FILE, f"{STATE_FILE}-wal", f"{STATE_FILE}-shm"):
            trust.check_file(self.layout.state_dir / name)
        fresh = not path.exists()
        # check_same_thread: only the IO thread may touch this connection. sqlite3's
        # statement cache is not safe across threads (cpython#118172: "bad parameter or
        # other API misuse", wrong rows); a stray use must fail loudly, not corrupt.
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before a caller hears "recorded"; with NORMAL a power
        # loss could lose a commit whose transcript bytes survived, and recovery would
        # then cut an acknowledged exchange.
        db.execute("PRAGMA synchronous=FULL")
        # Everything is read once at open and kept in memory; after that the database is
        # only appended to. sqlite's default 2 MB page cache per connection would fill with
        # pages of the random-keyed node index and never help: one client's state costs
        # memd up to 2 MB that way, which showed as slow RSS growth under bench/load.py.
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        # Freed cells are zeroed: a title re-derived after an edit, or a row `memory.forget`
        # removed, must not linger in a free page (issue #14).
        db.execute("PRAGMA secure_delete=ON")
        db.executescript(_SCHEMA + redactions.SCHEMA)
        _migrate(db)
        self.seal_key = sealing.client_key(self.layout)
        if sealing.seal_database(db, self.seal_key, self.layout.client_id):
            truncate_wal(db, what=str(path))  # the plain hashes' pages
        self.redacted = redactions.load(db)
        self.db = db
        # Every commit through one cursor: a cursor per statement leaves a weak reference
        # behind in the connection until sqlite3 prunes them (every 200; StateReader).
        self._cursor = db.cursor()
        loaded = self._load()
        self._recover(loaded, fresh)
        self.titles = Titles(loaded.convs)  # every file is read again before its next write
        return loaded

    def _load(self) -> Loaded:
        assert self.db is not None
        sessions = [
            Session(*row)
            for row in self.db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY started, rowid"
            )
        ]
        convs = [
            Conv(*row) for row in self.db.execute(f"SELECT {_CONV_COLUMNS} FROM conversations")
        ]
        if self.reader is not None:
            self.reader.close()
        self.reader = StateReader(self.layout.state_dir / STATE_FILE)
        return Loaded(sessions, convs, self.reader)

    def _recover(self, loaded: Loaded, fresh: bool) -> None:
        """Make transcripts agree with the committed state after a crash (see module doc)."""
        known = {s.session_id for s in loaded.sessions}
        for s in loaded.sessions:
            if s.state == SessionState.ACTIVE:
                outcome = transcript.reconcile(
                    self.layout.session_file(s.session_id), s.size, s.tail
                )
                if outcome == "shorter":
                    s.size = self.layout.session_file(s.session_id).stat().st_size
            else:
                self._settle(s)
        if fresh:
            return  # a lost state database must never cost the user their transcripts
        newest = max(known, default="")
        for path in sorted(self.layout.sessions.glob("*.md")):
            if (
                path.stem not in known
                and path.stem > newest
                and transcript.is_orphan(path, self.layout.client_id)
            ):
                path.unlink()
                transcript.fsync_dir(path.parent)
                log.info(
                    "transcript.unacknowledged_removed",
                    client=self.layout.client_id,
                    path=str(path),
                )

    def _settle(self, s: Session) -> None:
        """An ended session's state follows its file: live in sessions/ or in archive/.

        `compacted` with the transcript back in sessions/: a resume restored it and died
        before its commit (or a person moved it back); it is `ended` again, so it gets
        compacted again. `ended` with the transcript only in archive/: compaction
        finished but its mark never arrived.
        """
        live = self.layout.session_file(s.session_id).exists()
        archived = self.layout.archive_file(s.session_id).exists()
        state = s.state
        if s.state == SessionState.COMPACTED and live and not archived:
            state = SessionState.ENDED
        elif s.state == SessionState.ENDED and archived and not live:
            state = SessionState.COMPACTED
        if state != s.state:
            assert self.db is not None
            self.db.execute(
                "UPDATE sessions SET state = ? WHERE session_id = ?", (state, s.session_id)
            )
            log.info(
                "session.state_follows_file",
                client=self.layout.client_id,
                session=s.session_id,
                **{"from": s.state, "to": state},
            )
            s.move(state)

    def commit(self, batch: Sequence[Change]) -> None:
        """Reopen resumed sessions, append each transcript's share (one write + fsync), commit."""
        sizes: list[tuple[int, bytes | None, str]] = [
            (*self._reopen(c.reopen), c.reopen) for c in batch if c.reopen
        ]
        retitled = self._follow_edits(batch)
        writes: dict[str, tuple[bytes, list[bytes]]] = {}
        for change in batch:
            if change.write:
                sid, data, header = change.write
                writes.setdefault(sid, (header, []))[1].append(data)
        for sid, (header, chunks) in writes.items():
            f = self.files.get(sid)
            if f is None:
                f = self.files[sid] = transcript.AppendFile(self.layout.session_file(sid))
            size, digest = f.append(b"".join(chunks), header)
            self.titles.seen(sid, self.layout.session_file(sid))
            sizes.append((size, digest, sid))
        self._commit_state(batch, sizes, retitled)
        self.redacted = redactions.added(self.redacted, batch)
        if retitled and self.db is not None:  # an edit's old title must leave the WAL
            truncate_wal(self.db, what=str(self.layout.state_dir / STATE_FILE))
        for change in batch:
            for row in change.session_rows:
                if row[1] != "active" and row[0] in self.files:
                    self.files.pop(row[0]).close()

    def _follow_edits(self, batch: Sequence[Change]) -> list[tuple[str, int]]:
        """Titles from the files a person may have edited (memd.sessions.titles), put into
        this batch's rows and headings; the (title, conversation) updates for the rest."""
        changed: dict[int, str] = {}
        for sid in {c.write[0] for c in batch if c.write}:
            changed.update(self.titles.check(sid, self.layout.session_file(sid)))
        for change in batch:
            data = change.write[1] if change.write else None
            change.conv_rows, data = self.titles.fix(change.conv_rows, data)
            if change.write and data is not None:
                change.write = (change.write[0], data, change.write[2])
        return [(title, key) for key, title in changed.items()]

    def _reopen(self, session_id: str) -> tuple[int, bytes | None]:
        """Bring a resumed session's transcript back into sessions/; its size and tail digest.

        Restore hooks (compaction) normally did the move already; without them, or if
        they left it, the transcript is moved back here, and a summary left in sessions/
        is removed (it no longer covers the session). The file as it is now is the
        committed part that recovery keeps.
        """
        layout = self.layout
        live = layout.session_file(session_id)
        self.titles.forget_file(session_id)  # edited while it was ended, maybe
        if not live.exists() and layout.archive_file(session_id).exists():
            transcript.restore(layout, session_id)
            log.info("transcript.restored", client=layout.client_id, session=session_id)
        summary = layout.summary_file(session_id)
        if summary.exists():
            summary.unlink()
            transcript.fsync_dir(summary.parent)
            log.info(
                "compaction.stale_summary_removed", client=layout.client_id, session=session_id
            )
        return _measure(live)

    def _commit_state(
        self,
        batch: Sequence[Change],
        sizes: list[tuple[int, bytes | None, str]],
        retitled: Sequence[tuple[str, int]] = (),
    ) -> None:
        assert self.db is not None and self._cursor is not None
        db, cur = self.db, self._cursor
        cur.execute("BEGIN")
        try:
            for change in batch:
                cur.executemany(_UPSERT_SESSION, change.session_rows)
                cur.executemany(
                    f"INSERT OR REPLACE INTO conversations ({_CONV_COLUMNS})"
                    " VALUES (?,?,?,?,?,?,?,?)",
                    change.conv_rows,
                )
                cur.executemany("INSERT OR REPLACE INTO nodes VALUES (?,?,?,?)", change.nodes)
                # plain INSERT: a key is written once; a second one would be a bug
                cur.executemany("INSERT INTO exchange_keys VALUES (?,?,?,?,?)", change.keys)
            cur.executemany("UPDATE conversations SET title = ? WHERE conv = ?", retitled)
            redactions.add(cur, batch)
            # in order: a reopened file's measured size first, then what was appended to it
            cur.executemany("UPDATE sessions SET size = ?, tail = ? WHERE session_id = ?", sizes)
            cur.execute("COMMIT")
        except BaseException:
            # sqlite ends the transaction itself on some errors (SQLITE_FULL, IOERR); a
            # ROLLBACK then fails with "no transaction is active" and would hide them.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    cur.execute("ROLLBACK")
            raise

    def shrink(self) -> None:
        """Give back the page caches of both connections (the client is at rest): the
        next commit or lookup reads what it needs again, from the OS's file cache. A
        failure costs only the memory: it is logged, and recording goes on."""
        try:
            if self._cursor is not None:
                self._cursor.execute("PRAGMA shrink_memory").fetchall()
            if self.reader is not None:
                self.reader.shrink()
        except sqlite3.Error as exc:
            log.warning("sessions.shrink_failed", client=self.layout.client_id, error=str(exc))

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.db is not None:
            self.db.close()
            self.db, self._cursor = None, None


def _migrate(db: sqlite3.Connection) -> None:
    """Add the columns a state database from an earlier version lacks."""
    for table, name, definition in _ADDED_COLUMNS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if name not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
            log.info("sessions.state_migrated", table=table, column=name)


def _measure(path: Path) -> tuple[int, bytes | None]:
    """Size and tail digest of a transcript as it is on disk; (0, None) when it is gone."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - transcript.TAIL_BYTES))
            return size, transcript.tail_digest(fh.read())
    except FileNotFoundError:
        return 0, None
