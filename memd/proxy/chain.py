"""Response ids to the conversation they continue: what `previous_response_id` means.

An app on the Responses API may send only the new items of a turn and name the
response it continues (`previous_response_id`); the upstream keeps the rest. memd's
recording matches a turn to its conversation by the whole history (prefix hashes), so
the proxy keeps, per response it served, the parent id and the chat messages the turn
added (its new input and the reply, as memd.proxy.convert made them). A continuation's
history is the chain of those rows, so the turn is recorded into the same conversation.

The map is a small SQLite file, `<memory_dir>/.proxy/responses.sqlite3` (0600 in the
0700 folder of the proxy's keys), so it survives a restart of memd and of the proxy.
It is bounded: the oldest rows go past MAX_ROWS, and a turn larger than MAX_DELTA is not
kept (a continuation of it is then recorded as a new conversation). Rows are per client:
one client's response id never continues another client's conversation.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

FILE = "responses.sqlite3"
MAX_ROWS = 20_000
MAX_DELTA = 4 * 1024 * 1024  # characters of one turn's messages
MAX_DEPTH = 10_000  # turns walked back from one response id
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    client TEXT NOT NULL,
    parent TEXT,
    delta TEXT NOT NULL
)
"""


class ResponseChain:
    """The durable, bounded map; every call is a few indexed statements (sub-ms)."""

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

    def history(self, client_id: str, response_id: str) -> list[dict[str, Any]] | None:
        """The chat messages up to and including `response_id`'s reply; None if unknown."""
        db = self._open()
        deltas: list[list[dict[str, Any]]] = []
        current: str | None = response_id
        while current is not None and len(deltas) < MAX_DEPTH:
            row = db.execute(
                "SELECT parent, delta FROM responses WHERE id = ? AND client = ?",
                (current, client_id),
            ).fetchone()
            if row is None:
                break
            current = row[0]
            deltas.append(json.loads(row[1]))
        if not deltas:
            return None
        return [m for delta in reversed(deltas) for m in delta]

    def add(
        self, client_id: str, response_id: str, parent: str | None, delta: list[dict[str, Any]]
    ) -> bool:
        """Keep one turn; False when it is too large to keep."""
        text = json.dumps(delta, ensure_ascii=False)
        if len(text) > MAX_DELTA:
            return False
        db = self._open()
        db.execute(
            "INSERT OR REPLACE INTO responses (id, client, parent, delta) VALUES (?, ?, ?, ?)",
            (response_id, client_id, parent, text),
        )
        db.execute(
            "DELETE FROM responses WHERE seq <= (SELECT MAX(seq) FROM responses) - ?",
            (self.max_rows,),
        )
        return True

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
