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
            looked = _look(path, old)
            if looked is None:
                continue
            now[path.name], kept = looked
            if old is not None and not kept:
                lost.append(path.name)
        self._seen[layout.client_id] = now
        if before is not None:
            lost += [n for n in before if n not in now and not _moved_by_memd(layout, n)]
        return lost


def _look(path: Path, old: _Seen | None) -> tuple[_Seen, bool] | None:
    """The file as it is now, and whether it still starts with what `old` saw (one read:
    the digest of the old length is taken on the way to the whole file's)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if old is not None and (st.st_ino, st.st_size, st.st_mtime_ns) == (
        old.ino,
        old.size,
        old.mtime_ns,
    ):
        return old, True
    at = old.size if old is not None and old.size <= st.st_size else None
    digests = _digests(path, st.st_size, at)
    if digests is None:
        return None
    whole, prefix = digests
    kept = old is not None and prefix == old.digest
    return _Seen(st.st_ino, st.st_size, st.st_mtime_ns, whole), kept


def _digests(path: Path, size: int, at: int | None) -> tuple[bytes, bytes | None] | None:
    """blake2b of the file's first `size` bytes, and of its first `at` (if given); None
    when it is gone or shorter than `size` (changed under us: the next round sees it)."""
    h = hashlib.blake2b(digest_size=16)
    prefix = h.digest() if at == 0 else None
    done = 0
    try:
        with open(path, "rb") as fh:
            while done < size:
                want = min(_CHUNK, size - done)
                if at is not None and done < at:
                    want = min(want, at - done)
                block = fh.read(want)
                if not block:
                    return None
                h.update(block)
                done += len(block)
                if at is not None and done == at:
                    prefix = h.digest()
    except FileNotFoundError:
        return None
    return h.digest(), prefix


def _moved_by_memd(layout: ClientLayout, name: str) -> bool:
    stem = name.removesuffix(".md")
    if layout.archive_file(stem).exists():
        return True  # compacted: the raw transcript lives on in archive/
    session = stem.removesuffix("-summary")
    return stem != session and layout.session_file(session).exists()  # restored
