"""Per-session compaction state: the states and their transitions, backoff, the sqlite store.

Each client keeps its own `<root>/.memd/compaction.sqlite3` (WAL), so pending and failed
compactions resume after a restart and no schema is shared with the session store.

One thread policy for sqlite, as in the session store: never on the event loop. An open
client's records (`ClientRecords`) own one thread that opens, writes and closes its
database; a change is made in memory at once and its write queued, in order, on that
thread (`flush()` waits for what is queued).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

import structlog

from memd.compaction.files import FileGuard
from memd.compaction.usage import Ledger, Usage, add_row, load_rows
from memd.layout import ClientLayout
from memd.markdown import iso
from memd.redaction import truncate_wal

log = structlog.get_logger()

STATE_FILE = "compaction.sqlite3"


class CompactionStates:
    """Where a session's compaction stands; import-free names shown by status."""

    PENDING = "pending"  # due to run (now, or once compaction is enabled)
    FAILED = "failed"  # the last attempt failed; retried at next_retry
    COMPACTED = "compacted"  # summary in sessions/, transcript in archive/
    RESTORING = "restoring"  # a restore was started; finished when the client reopens
    MISSING = "missing"  # the transcript is gone (deleted by the user): nothing to do
    DEFERRED = "deferred"  # the daily token cap was reached; runs again at next_retry


S = CompactionStates
# None: no record (never submitted, or reset by a restore).
ALLOWED: dict[str | None, frozenset[str | None]] = {
    None: frozenset({S.PENDING, S.COMPACTED, S.RESTORING}),
    S.PENDING: frozenset({S.PENDING, S.FAILED, S.COMPACTED, S.MISSING, S.RESTORING, S.DEFERRED}),
    S.FAILED: frozenset({S.PENDING, S.RESTORING}),
    # At the cap: waits for the next UTC day (step -> pending), or a resume (restoring).
    S.DEFERRED: frozenset({S.PENDING, S.RESTORING}),
    S.COMPACTED: frozenset({S.PENDING, S.COMPACTED, S.RESTORING}),
    S.MISSING: frozenset({S.PENDING, S.COMPACTED, S.RESTORING}),
    S.RESTORING: frozenset({None, S.RESTORING}),
}


def check_transition(session_id: str, old: str | None, new: str | None) -> None:
    """Refuse a state change the table above does not allow (a bug, never user input)."""
    if new not in ALLOWED[old]:
        raise RuntimeError(f"compaction state of {session_id}: {old} -> {new} is not allowed")


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n (1-based): base * factor**(n-1), at most cap."""

    base: float = 60.0
    cap: float = 3600.0
    factor: float = 2.0

    def delay(self, attempts: int) -> float:
        return min(self.cap, self.base * self.factor ** max(0, attempts - 1))


@dataclass
class Record:
    """One session's compaction state, as stored in compaction.sqlite3."""

    session_id: str
    state: str
    attempts: int = 0  # failed attempts since it was submitted
    last_error: str | None = None
    next_retry: float | None = None
    updated: float = 0.0
    compacted_at: float | None = None
    llm_provider: str | None = None
    llm_model: str | None = None
    parts: int = 0
    requests: int = 0

    def public(self, layout: ClientLayout, running: bool = False) -> dict[str, Any]:
        """What sessions.list and status show for this session."""
        out = asdict(self)
        out["running"] = running
        for key in ("updated", "compacted_at", "next_retry"):
            out[key] = iso(out[key]) if out[key] is not None else None
        if self.state == S.COMPACTED:
            out["summary_path"] = str(layout.summary_file(self.session_id))
            out["archive_path"] = str(layout.archive_file(self.session_id))
        return out


_COLUMNS = [f.name for f in Record.__dataclass_fields__.values()]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS compaction (
    session_id TEXT PRIMARY KEY, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT, next_retry REAL, updated REAL NOT NULL, compacted_at REAL,
    llm_provider TEXT, llm_model TEXT, parts INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0);
"""


class Store:
    """One client's `.memd/compaction.sqlite3`: its own file, so no schema is shared."""

    def __init__(self, layout: ClientLayout) -> None:
        layout.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = layout.state_dir / STATE_FILE
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # private; -wal/-shm follow it
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a lost last commit only means a compaction runs again, and that converges.
        self.db.execute("PRAGMA synchronous=NORMAL")
        # A forgotten session's row (its last error may quote an LLM's answer) leaves no
        # freed cell behind, and `delete` empties the WAL (memd.redaction.residue).
        self.db.execute("PRAGMA secure_delete=ON")
        self.db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def load(self) -> dict[str, Record]:
        with self._lock:
            rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM compaction").fetchall()
        return {row[0]: Record(*row) for row in rows}

    def put(self, rec: Record) -> None:
        marks = ", ".join("?" * len(_COLUMNS))
        with self._lock:
            self.db.execute(
                f"INSERT OR REPLACE INTO compaction ({', '.join(_COLUMNS)}) VALUES ({marks})",
                tuple(asdict(rec).values()),
            )

    def delete(self, session_id: str) -> None:
        with self._lock:
            self.db.execute("DELETE FROM compaction WHERE session_id = ?", (session_id,))
            truncate_wal(self.db, what=STATE_FILE)

    def usage_rows(self) -> dict[tuple[str, str], Usage]:
        """The token usage rows kept in the same file (see memd.compaction.usage)."""
        with self._lock:
            return load_rows(self.db)

    def add_usage(self, session_id: str, day: str, usage: Usage) -> None:
        with self._lock:
            add_row(self.db, session_id, day, usage)

    def close(self) -> None:
        with self._lock:
            self.db.close()


class ClientRecords:
    """One open client's compaction state: its records, in memory for status and written
    through on the client's own sqlite thread, its token ledger, and its file guard."""

    def __init__(self, layout: ClientLayout, store: Store, io: ThreadPoolExecutor) -> None:
        self.layout = layout
        self.store = store
        self._io = io
        self.records = store.load()
        self.ledger = Ledger(store.usage_rows(), self._add_usage)
        self.guard = FileGuard()

    @classmethod
    async def open(cls, layout: ClientLayout) -> ClientRecords:
        """Open the client's database on a thread of its own, which then does every write."""
        io = ThreadPoolExecutor(1, thread_name_prefix=f"memd-compaction-{layout.client_id}")
        try:
            return await asyncio.wrap_future(io.submit(lambda: cls(layout, Store(layout), io)))
        except BaseException:
            io.shutdown(wait=False)
            raise

    async def flush(self) -> None:
        """Wait until every write queued so far is in the database."""
        await asyncio.wrap_future(self._io.submit(_nothing))

    async def close(self) -> None:
        """Refuse later file steps, write what is queued, close the database and the thread."""
        try:
            await asyncio.to_thread(self.guard.close)
            await asyncio.wrap_future(self._io.submit(self.store.close))
        finally:
            self._io.shutdown(wait=False)

    def _write(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            future = self._io.submit(fn, *args)
        except RuntimeError:  # closed: a job that outlived close(); its state reloads
            log.warning("compaction.state_write_after_close", client=self.layout.client_id)
            return
        future.add_done_callback(self._written)

    def _written(self, future: Future[None]) -> None:
        if not future.cancelled() and (exc := future.exception()) is not None:
            # The record in memory is right; a restart reloads the last one written and
            # runs the compaction again, which converges (memd.compaction.job).
            log.error(
                "compaction.state_write_failed", client=self.layout.client_id, error=repr(exc)
            )

    def _add_usage(self, session_id: str, day: str, usage: Usage) -> None:
        self._write(self.store.add_usage, session_id, day, usage)

    def get(self, session_id: str) -> Record | None:
        return self.records.get(session_id)

    def set(self, session_id: str, state: str | None, now: float, **changes: Any) -> None:
        """The one place a session's compaction state changes: checked, logged, persisted
        (queued on the client's sqlite thread, in order).

        `state` None drops the record (a restore: compacted again when it next ends).
        """
        rec = self.records.get(session_id)
        old = rec.state if rec else None
        check_transition(session_id, old, state)
        if old != state:
            log.info(
                "compaction.state",
                client=self.layout.client_id,
                session=session_id,
                **{"from": old, "to": state},
            )
        if state is None:
            self.records.pop(session_id, None)
            self._write(self.store.delete, session_id)
            return
        rec = replace(rec or Record(session_id, state), state=state, updated=now, **changes)
        self.records[session_id] = rec
        self._write(self.store.put, rec)

    def counts(self) -> dict[str, int]:
        kinds = (S.PENDING, S.FAILED, S.DEFERRED, S.COMPACTED, S.MISSING)
        counts = {state: 0 for state in kinds}
        for rec in self.records.values():
            counts[rec.state] = counts.get(rec.state, 0) + 1
        return counts


def _nothing() -> None:
    """Queued behind the writes so far: done once they are."""
