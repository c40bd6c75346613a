"""Erase exchanges from a client's transcripts and session state, in the store's IO thread.

`erase` is what `memory.forget` asks of the session store: for each session, the named
exchanges are cut out of `sessions/<id>.md` and `archive/<id>.md` (rewritten atomically;
headers and the other exchanges stay byte for byte), and every row that was derived from
them goes: prefix-index nodes, exchange keys, titles (taken again from what is left), a
conversation with nothing left, an ended session with nothing left (and its files).

SQLite keeps deleted cells in free pages and old page images in the WAL: with
`secure_delete` on, freed space is zeroed, and a TRUNCATE checkpoint empties the WAL, so
the text is gone from `.memd/state.sqlite3*` too. Runs in the store's one IO thread,
between two group commits, holding compaction's file lock so no compaction step moves a
file while it is being cut.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from memd.markdown import (
    exchange_spans,
    first_user_titles,
    parse_transcript,
    remove_exchanges,
    replace_file,
)
from memd.markdown import fsync_dir as _fsync_dir
from memd.sessions import exchange_keys
from memd.sessions.store import StateStore, _measure

log = structlog.get_logger()

Key = tuple[int, int]  # (conversation number, exchange number)


@dataclass
class Erased:
    """What was removed: exchanges (each counted once, archived copy or not), files
    rewritten or deleted."""

    exchanges: int = 0
    files: int = 0
    sessions: int = 0  # session rows removed because nothing was left of them

    def add(self, other: Erased) -> None:
        self.exchanges += other.exchanges
        self.files += other.files
        self.sessions += other.sessions


def erase(
    store: StateStore, cuts: Mapping[str, set[Key]], files_lock: threading.Lock | None = None
) -> Erased:
    """Cut `cuts` (session id -> exchange keys) from files and state; see module doc."""
    assert store.db is not None
    db = store.db
    total = Erased()
    lock = files_lock or threading.Lock()
    db.execute("PRAGMA secure_delete = ON")
    with lock:
        db.execute("BEGIN")
        try:
            for sid, keys in cuts.items():
                total.add(_erase_session(store, sid, keys))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    log.info(
        "forget.erased",
        client=store.layout.client_id,
        sessions=len(cuts),
        exchanges=total.exchanges,
        files=total.files,
    )
    return total


def _erase_session(store: StateStore, sid: str, keys: set[Key]) -> Erased:
    assert store.db is not None
    db = store.db
    row = db.execute("SELECT state FROM sessions WHERE session_id = ?", (sid,)).fetchone()
    active = row is not None and row[0] == "active"
    out = Erased()
    cut: set[Key] = set()
    digests: set[tuple[int, bytes]] = set()
    remaining: dict[int, str] = {}  # conversation number -> title, from what is left
    left = 0
    layout = store.layout
    aside = sorted(layout.archive.glob(f"{sid}.md.prev-*"))  # kept by compaction/files.py
    for path in (layout.session_file(sid), layout.archive_file(sid), *aside):
        text = _read(path)
        if text is None:
            continue
        for conv, number, digest in _digests(text, keys, store.seal_key):
            cut.add((conv, number))
            digests.add((conv, digest))
        new, n = remove_exchanges(text, keys)
        still = len(exchange_spans(new))
        left += still
        for conv, title in first_user_titles(new).items():
            if any(s.conversation == conv for s in exchange_spans(new)):
                remaining.setdefault(conv, title)
        if not n:
            continue
        f = store.files.pop(sid, None) if path == layout.session_file(sid) else None
        if f is not None:
            f.close()  # reopened at the next append, on the new file
        if not still and not active:
            path.unlink()
            _fsync_dir(path.parent)
        else:
            replace_file(path, new.encode("utf-8"))
        out.files += 1
    out.exchanges = len(cut)
    store.titles.forget_file(sid)
    _erase_rows(store, sid, cut, digests, remaining)
    if active:
        size, tail = _measure(layout.session_file(sid))
        db.execute("UPDATE sessions SET size = ?, tail = ? WHERE session_id = ?", (size, tail, sid))
    elif not left and row is not None:
        db.execute("DELETE FROM sessions WHERE session_id = ?", (sid,))
        out.sessions += 1
    return out


def _erase_rows(
    store: StateStore,
    sid: str,
    cut: set[Key],
    digests: set[tuple[int, bytes]],
    remaining: Mapping[int, str],
) -> None:
    """Nodes, exchange keys and titles of the cut exchanges; conversations with none left."""
    assert store.db is not None
    db = store.db
    convs = dict(
        db.execute("SELECT number, conv FROM conversations WHERE session_id = ?", (sid,)).fetchall()
    )
    for number, exchange in cut:
        key = convs.get(number)
        if key is not None:
            db.execute("DELETE FROM nodes WHERE conv = ? AND exchange = ?", (key, exchange))
    for number, digest in digests:
        key = convs.get(number)
        if key is not None:
            db.execute("DELETE FROM exchange_keys WHERE conv = ? AND digest = ?", (key, digest))
    touched = {number for number, _ in cut}
    for number in touched:
        key = convs.get(number)
        if key is None:
            continue
        if number in remaining:
            db.execute(
                "UPDATE conversations SET title = ? WHERE conv = ?", (remaining[number], key)
            )
        else:  # nothing of it is left: it is forgotten as a whole
            for table in ("nodes", "exchange_keys", "conversations"):
                db.execute(f"DELETE FROM {table} WHERE conv = ?", (key,))


def _digests(text: str, keys: set[Key], key: bytes) -> list[tuple[int, int, bytes]]:
    """(conversation, exchange, record_exchange digest) of the exchanges to be cut."""
    out: list[tuple[int, int, bytes]] = []
    for conv in parse_transcript(text).conversations:
        for ex in conv.exchanges:
            if (conv.number, ex.number) in keys:
                user = next((p.text for p in ex.parts if p.label == "User"), "")
                reply = next((p.text for p in ex.parts if p.label == "Assistant"), "")
                out.append((conv.number, ex.number, exchange_keys.digest(user, reply, key)))
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
