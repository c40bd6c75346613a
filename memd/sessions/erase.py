"""Erase exchanges from a client's transcripts and session state, in the store's IO thread.

`erase` is what `memory.forget` asks of the session store: for each session, the named
exchanges are cut out of `sessions/<id>.md` and `archive/<id>.md` (rewritten atomically;
headers and the other exchanges stay byte for byte), and every row that was derived from
them goes: prefix-index nodes, exchange keys, titles (taken again from what is left), a
conversation with nothing left, an ended session with nothing left (and its files).
The headings of what is left of a conversation carry the title it has now (its first
user message that is left), never the forgotten one.

SQLite keeps deleted cells in free pages and old page images in the WAL: with
`secure_delete` on, freed space is zeroed, and a TRUNCATE checkpoint empties the WAL, so
the text is gone from `.memd/state.sqlite3*` too. Runs in the store's one IO thread,
between two group commits, holding compaction's file lock so no compaction step moves a
file while it is being cut.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from memd.markdown import (
    Span,
    exchange_spans,
    first_user_titles,
    parse_transcript,
    remove_exchanges,
    replace_file,
    retitle,
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
    keyed = _keyed(store, sid, keys)
    for path in (layout.session_file(sid), layout.archive_file(sid), *aside):
        text = _read(path)
        if text is None:
            continue
        new, n, removed = _remove(text, keys)
        cut.update(removed)
        if keyed:
            digests.update((conv, d) for conv, _, d in _digests(text, keys & keyed, store.seal_key))
        spans = exchange_spans(new)
        titles = first_user_titles(new)
        new = _retitled(new, spans, titles, {conv for conv, _ in keys})
        left += len(spans)
        for conv in {s.conversation for s in spans}:
            remaining.setdefault(conv, titles.get(conv, ""))
        still = len(spans)
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
    """Nodes, exchange keys and titles of the cut exchanges; conversations with none left.

    Set-based: the keys go into temp tables and each table is deleted from in one pass,
    so a forget of N exchanges costs one scan, not N (row by row, a 150k-message chat
    took ten minutes). The temp tables hold numbers and digests, never text."""
    assert store.db is not None
    db = store.db
    convs = dict(
        db.execute("SELECT number, conv FROM conversations WHERE session_id = ?", (sid,)).fetchall()
    )
    touched = {number for number, _ in cut}
    gone = [convs[n] for n in touched if n in convs and n not in remaining]
    kept_cut = [(convs[n], ex) for n, ex in cut if n in convs and n in remaining]
    _delete_sets(db, kept_cut, [(convs[n], d) for n, d in digests if n in convs], gone)
    db.executemany(
        "UPDATE conversations SET title = ? WHERE conv = ?",
        [(remaining[n], convs[n]) for n in touched if n in convs and n in remaining],
    )


def _delete_sets(
    db: sqlite3.Connection,
    cut: list[tuple[int, int]],
    digests: list[tuple[int, bytes]],
    gone: list[int],
) -> None:
    """Delete the rows of `cut` (conv key, exchange), `digests` (conv key, digest) and of
    whole conversations `gone`, one pass per table."""
    db.execute("CREATE TEMP TABLE IF NOT EXISTS erase_cut (conv INTEGER, exchange INTEGER)")
    db.execute("CREATE TEMP TABLE IF NOT EXISTS erase_digest (conv INTEGER, digest BLOB)")
    db.execute("CREATE TEMP TABLE IF NOT EXISTS erase_conv (conv INTEGER PRIMARY KEY)")
    try:
        db.executemany("INSERT INTO temp.erase_cut VALUES (?, ?)", cut)
        db.executemany("INSERT INTO temp.erase_digest VALUES (?, ?)", digests)
        db.executemany("INSERT INTO temp.erase_conv VALUES (?)", ((c,) for c in gone))
        db.execute("DELETE FROM nodes WHERE conv IN (SELECT conv FROM temp.erase_conv)")
        db.execute(
            "DELETE FROM nodes WHERE (conv, exchange) IN "
            "(SELECT conv, exchange FROM temp.erase_cut)"
        )
        db.execute(
            "DELETE FROM exchange_keys WHERE (conv, digest) IN "
            "(SELECT conv, digest FROM temp.erase_digest)"
            " OR conv IN (SELECT conv FROM temp.erase_conv)"
        )
        db.execute("DELETE FROM conversations WHERE conv IN (SELECT conv FROM temp.erase_conv)")
        # A session whose last conversation is gone writes a fresh header next time: a
        # conversation recorded later may get the same key (the keys count from the
        # highest left), and must not pass for the forgotten one (numbered 0).
        db.execute(
            "UPDATE sessions SET last_conv = NULL WHERE last_conv IN "
            "(SELECT conv FROM temp.erase_conv)"
        )
    finally:
        for table in ("erase_cut", "erase_digest", "erase_conv"):
            db.execute(f"DELETE FROM temp.{table}")


def _retitled(text: str, spans: list[Span], titles: Mapping[int, str], touched: set[int]) -> str:
    """`text` with the exchange headings of `touched` conversations carrying the title of
    what is left of them: a forgotten first message must not live on as the title."""
    lines: list[str] | None = None
    for span in spans:
        if span.conversation not in touched:
            continue
        title = titles.get(span.conversation, "")
        if span.title == title:
            continue
        lines = lines if lines is not None else text.split("\n")
        lines[span.start] = retitle(lines[span.start], title)
    return text if lines is None else "\n".join(lines)


def _remove(text: str, keys: set[Key]) -> tuple[str, int, set[Key]]:
    """`remove_exchanges`, and which of `keys` the text held."""
    new, n = remove_exchanges(text, keys)
    if n == len(keys) or not n:  # all of them, or none: no second scan to say which
        return new, n, set(keys) if n else set()
    return new, n, {s.key for s in exchange_spans(text)} & keys


def _keyed(store: StateStore, sid: str, keys: set[Key]) -> set[Key]:
    """The keys whose conversation has exchange_ids recorded (only theirs need digests:
    parsing every message of a long chat to hash it doubled a forget's time)."""
    assert store.db is not None
    convs = {conv for conv, _ in keys}
    rows = store.db.execute(
        "SELECT DISTINCT c.number FROM conversations c JOIN exchange_keys k ON k.conv = c.conv"
        " WHERE c.session_id = ?",
        (sid,),
    ).fetchall()
    numbers = {r[0] for r in rows} & convs
    return {k for k in keys if k[0] in numbers}


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
