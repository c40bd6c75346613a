"""`memd redact`: the current scrubbing rules applied to what a client already stored.

Transcripts and summaries in `sessions/`, raw transcripts in `archive/` (and the copies
compaction keeps aside there) are scrubbed as whole files: a secret is replaced by its
marker wherever it stands, headings included (they carry the conversation's title).
Titles in the state database are scrubbed too. Closed `<private>` spans go as at record
time; an unclosed one is a user-text rule, and a whole file has no roles to tell.

`scan` only reads (a dry run, and the plan a confirmation shows). `rescrub` rewrites
files atomically (memd.markdown.replace_file) in the store's IO thread, between two
group commits and under compaction's file lock, like `memory.forget`'s erase: an active
transcript's committed size and tail follow the new file, so recovery keeps it whole.
Then the WAL is truncated. Conversations recorded before scrubbing existed were hashed
with their secrets: after a redact the app's next resend of one starts a new one.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from memd.layout import ClientLayout
from memd.markdown import replace_file
from memd.redaction import Scrubber, truncate_wal
from memd.sessions.store import STATE_FILE, StateStore, _measure

log = structlog.get_logger()


@dataclass
class Found:
    """What a scan or a rewrite found, by file (relative to the client's folder)."""

    files: dict[str, Counter[str]] = field(default_factory=dict)
    titles: int = 0

    def row(self) -> dict[str, object]:
        return {
            "files": [{"file": f, "kinds": dict(k)} for f, k in sorted(self.files.items())],
            "titles": self.titles,
            "total": sum(sum(k.values()) for k in self.files.values()) + self.titles,
        }


def candidates(layout: ClientLayout, only: Iterable[str] | None = None) -> list[Path]:
    """The files a redact looks at, or those of `only` (relative names) that are among them."""
    paths = [
        *sorted(layout.sessions.glob("*.md")),
        *sorted(layout.archive.glob("*.md")),
        *sorted(layout.archive.glob("*.md.prev-*")),
    ]
    if only is None:
        return paths
    wanted = set(only)
    return [p for p in paths if str(p.relative_to(layout.root)) in wanted]


def scan(layout: ClientLayout, scrubber: Scrubber, only: Iterable[str] | None = None) -> Found:
    """What the current rules would replace, by file; reads only."""
    found = Found()
    for path in candidates(layout, only):
        kinds = _scrubbed(path, scrubber)[1]
        if kinds:
            found.files[str(path.relative_to(layout.root))] = kinds
    return found


def rescrub(
    store: StateStore,
    scrubber: Scrubber,
    only: Iterable[str] | None,
    files_lock: threading.Lock | None = None,
) -> Found:
    """Rewrite the files (of `only`, or all) and titles the rules change; see module doc."""
    assert store.db is not None
    layout, db = store.layout, store.db
    found = Found()
    with files_lock or threading.Lock():
        db.execute("BEGIN")
        try:
            for path in candidates(layout, only):
                text, kinds = _scrubbed(path, scrubber)
                if not kinds:
                    continue
                found.files[str(path.relative_to(layout.root))] = kinds
                _rewrite(store, path, text)
            found.titles = _titles(store, scrubber)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    truncate_wal(db, what=str(layout.state_dir / STATE_FILE))
    log.info("redact.done", client=layout.client_id, files=len(found.files), titles=found.titles)
    return found


def _scrubbed(path: Path, scrubber: Scrubber) -> tuple[str, Counter[str]]:
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return "", Counter()
    done = scrubber.scrub(text)
    return done.text, done.kinds


def _rewrite(store: StateStore, path: Path, text: str) -> None:
    layout, db = store.layout, store.db
    assert db is not None
    sid = path.name.split(".md")[0]
    live = path == layout.session_file(sid)
    f = store.files.pop(sid, None) if live else None
    if f is not None:
        f.close()  # reopened at the next append, on the new file
    replace_file(path, text.encode("utf-8"))
    if live:
        store.titles.forget_file(sid)
        size, tail = _measure(path)
        db.execute("UPDATE sessions SET size = ?, tail = ? WHERE session_id = ?", (size, tail, sid))


def _titles(store: StateStore, scrubber: Scrubber) -> int:
    assert store.db is not None
    db = store.db
    n = 0
    rows = db.execute("SELECT conv, title FROM conversations WHERE title IS NOT NULL").fetchall()
    for conv, title in rows:
        done = scrubber.scrub(title)
        if done.count:
            db.execute("UPDATE conversations SET title = ? WHERE conv = ?", (done.text, conv))
            n += done.count
    return n
