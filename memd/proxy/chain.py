"""Response ids to the point of memd's record they continue: `previous_response_id`.

An app on the Responses API may send only the new items of a turn and name the
response it continues (`previous_response_id`); the upstream keeps the rest. memd
matches a turn to its conversation by the whole history (prefix hashes), so for each
response it recorded the proxy keeps the `head` that `memory.record_chat` returned (a
16-byte hash of the history up to that reply, no text). A continuation is recorded with
`after` = that head: the same conversation, as if the whole history had been sent.

The map is a small SQLite file, `<memory_dir>/.proxy/responses.sqlite3` (0600 in the
0700 folder of the proxy's keys), so it survives a restart of memd and of the proxy. It
is bounded (the oldest rows go past MAX_ROWS) and per client: one client's response id
never continues another client's conversation. It holds ids and hashes only, never
conversation text, so forgetting in memd leaves nothing readable here.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

FILE = "responses.sqlite3"
MAX_ROWS = 100_000  # ~150 bytes each
SCHEMA = """
CREATE TABLE IF NOT EXISTS heads (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    client TEXT NOT NULL,
    head TEXT NOT NULL
)
"""


class ResponseChain:
    """The durable, bounded map; every call is one or two indexed statements (sub-ms)."""

    def __init__(self, folder: Path, max_rows: int = MAX_ROWS) -> None:
        self.path = Path(folder) / FILE
        self.max_rows = max_rows
        self._db: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.close(fd)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(SCHEMA)
            self._db = db
        return self._db

    def head(self, client_id: str, response_id: str) -> str | None:
        """The head recorded for the client's response, or None when unknown."""
        row = (
            self._open()
            .execute("SELECT head FROM heads WHERE id = ? AND client = ?", (response_id, client_id))
            .fetchone()
        )
        return row[0] if row is not None else None

    def add(self, client_id: str, response_id: str, head: str) -> None:
        db = self._open()
        db.execute(
            "INSERT OR REPLACE INTO heads (id, client, head) VALUES (?, ?, ?)",
            (response_id, client_id, head),
        )
        db.execute(
            "DELETE FROM heads WHERE seq <= (SELECT MAX(seq) FROM heads) - ?", (self.max_rows,)
        )

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
