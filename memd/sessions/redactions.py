"""How many secrets were redacted on record, by kind: counts for `memd status`, never text.

Kept in the client's state database and committed in the same transaction as the
exchanges they were redacted from, so the count is exactly what reached the disk.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Protocol

SCHEMA = """
CREATE TABLE IF NOT EXISTS redactions (kind TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""
_ADD = """
INSERT INTO redactions (kind, count) VALUES (?, ?)
ON CONFLICT (kind) DO UPDATE SET count = count + excluded.count
"""


class _Counted(Protocol):
    redacted: Mapping[str, int]


def load(db: sqlite3.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT kind, count FROM redactions").fetchall())


def add(cur: sqlite3.Cursor, batch: Sequence[_Counted]) -> None:
    """Within the batch's transaction (on the store's one cursor): its counts added."""
    rows = [(kind, n) for change in batch for kind, n in change.redacted.items() if n]
    if rows:
        cur.executemany(_ADD, rows)


def added(before: Mapping[str, int], batch: Sequence[_Counted]) -> dict[str, int]:
    """The counts after a committed batch (a new dict: status reads the old one meanwhile)."""
    out = dict(before)
    for change in batch:
        for kind, n in change.redacted.items():
            out[kind] = out.get(kind, 0) + n
    return out
