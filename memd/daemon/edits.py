"""Text a person removed from `sessions/` leaves the index physically, within a minute.

memsearch's watcher re-indexes an edited transcript, but Milvus Lite only marks the old
chunks deleted: their text stays in `.memsearch/` segment files until they are compacted
or rebuilt (measured: an exchange edited out with `sed -i` was still there). So the
daemon's monitor asks `EditWatch.removed` each round (every `monitor_interval_seconds`,
60 s by default) whether any file in `sessions/` lost text since the last round, and if
so rebuilds the client's index from the markdown (Pipelines.rebuild): the cheapest sound
trigger, paid only after a removal, never on memd's own appends.

A file "lost text" when its first `size` bytes (as of the last round) no longer hash the
same: memd only appends, so anything else is an edit. A file gone from `sessions/` lost
its text unless it went where memd moves files (`archive/<id>.md`, whose text is kept by
design; a summary dropped because its session was restored). A file is hashed again only
when its size, mtime or inode changed: a round over unchanged files costs one stat each.
memd's own rewrites (forget, redact) rebuild the index themselves and then `forget_client`
so the next round does not rebuild it again.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from memd.layout import ClientLayout

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class _Seen:
    ino: int
    size: int
    mtime_ns: int
    digest: bytes  # of the whole file as it was


class EditWatch:
    """Per client: every `sessions/*.md` as last seen (stat and content digest)."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, _Seen]] = {}

    def forget_client(self, client_id: str) -> None:
        """Start afresh: the next round only records (memd rewrote files itself)."""
        self._seen.pop(client_id, None)

    def removed(self, layout: ClientLayout) -> list[str]:
        """Names of the files that lost text since the last call ([] on the first)."""
        before = self._seen.get(layout.client_id)
        now: dict[str, _Seen] = {}
        lost: list[str] = []
        for path in sorted(layout.sessions.glob("*.md")):
            old = before.get(path.name) if before is not None else None
            seen = _look(path, old)
            if seen is None:
                continue
            now[path.name] = seen
            if old is not None and seen is not old and not _extends(path, old):
                lost.append(path.name)
        self._seen[layout.client_id] = now
        if before is not None:
            lost += [n for n in before if n not in now and not _moved_by_memd(layout, n)]
        return lost


def _look(path: Path, old: _Seen | None) -> _Seen | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if old is not None and (st.st_ino, st.st_size, st.st_mtime_ns) == (
        old.ino,
        old.size,
        old.mtime_ns,
    ):
        return old
    digest = _digest(path, st.st_size)
    return _Seen(st.st_ino, st.st_size, st.st_mtime_ns, digest) if digest is not None else None


def _extends(path: Path, old: _Seen) -> bool:
    """The file still starts with what it was: memd appended, nothing was removed."""
    return _digest(path, old.size) == old.digest


def _digest(path: Path, size: int) -> bytes | None:
    """blake2b of the file's first `size` bytes; None when it is gone or shorter."""
    h = hashlib.blake2b(digest_size=16)
    left = size
    try:
        with open(path, "rb") as fh:
            while left > 0:
                block = fh.read(min(_CHUNK, left))
                if not block:
                    return None
                h.update(block)
                left -= len(block)
    except FileNotFoundError:
        return None
    return h.digest()


def _moved_by_memd(layout: ClientLayout, name: str) -> bool:
    stem = name.removesuffix(".md")
    if layout.archive_file(stem).exists():
        return True  # compacted: the raw transcript lives on in archive/
    session = stem.removesuffix("-summary")
    return stem != session and layout.session_file(session).exists()  # restored
