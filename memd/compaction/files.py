"""The crash-safe file steps of compaction: install a summary, archive, restore, sweep.

On disk, for session S of a client (paths relative to the client root):

1. the summary is written to `.memd/tmp/`, fsynced, and moved to `sessions/S-summary.md`
   (a file moved in from outside the watched tree is a *create* for memsearch's watcher;
   a rename inside it would be ignored), then `sessions/` is fsynced;
2. the transcript moves from `sessions/S.md` to `archive/S.md` (a *delete* for the
   watcher, which drops its chunks), then both folders are fsynced.

   Then the session's base (`.memd/compaction-base/S-summary.md`, if it resumed) is
   dropped: the new summary replaced it.

A crash between any two steps leaves complete files only. `restore_files` undoes 1-2
(transcript back first, so the session never leaves recall, then the summary moved
aside as the base of the next, incremental, compaction).

The steps are blocking and run in worker threads; a thread cannot be cancelled, so a
step of a compaction that was cancelled may still start after a restore. Every step
therefore takes the client's file lock and, under it, checks a *restore token* taken when
its compaction started: a restore of the session since then bumps the token, and the
step refuses (`Superseded`) instead of undoing the restore. Lock and tokens are a
`FileGuard`, owned by the Compactor that has the client open.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

from memd.compaction.base import base_file, stale_bases
from memd.layout import ClientLayout
from memd.markdown import fsync_dir, read_front_matter

log = structlog.get_logger()

TMP_PREFIX = "compaction."

# Called in the worker thread as hook(step, session_id) before a step takes the file lock
# (step is "install" or "archive"): the point where a cancelled compaction's step can no
# longer be stopped. Tests use it to hold a step there.
StepHook = Callable[[str, str], None]


class TranscriptChanged(Exception):
    """The transcript changed while it was being summarised; the summary is stale."""


class Superseded(Exception):
    """The session was restored after this compaction started; its file steps must not run."""


class FileGuard:
    """One client's file lock, and how many restores of each session were made under it.

    Owned by whoever runs the client's compactions (the Compactor, one per open client)
    and closed with it: once `close()` returns no step of this guard runs any more, also
    one whose cancelled task left its thread behind. Whoever works on the files without
    a Compactor (`memd.compaction.job.restore`, tools) makes a guard of its own.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._restores: dict[str, int] = {}
        self._closed = False

    def token(self, session_id: str) -> int:
        """Taken when a compaction starts; its file steps refuse once a restore changed it."""
        return self._restores.get(session_id, 0)

    @contextlib.contextmanager
    def step(
        self, layout: ClientLayout, session_id: str, token: int, step: str, hook: StepHook | None
    ) -> Iterator[None]:
        """Hold the lock for one step of a compaction, if no restore came since `token`."""
        if hook is not None:
            hook(step, session_id)
        with self.lock:
            if self._closed or self.token(session_id) != token:
                log.info(
                    "compaction.step_superseded",
                    client=layout.client_id,
                    session=session_id,
                    step=step,
                )
                raise Superseded(f"{session_id} was restored while it was being compacted")
            yield

    @contextlib.contextmanager
    def restoring(self, session_id: str) -> Iterator[None]:
        """Hold the lock for a restore, which makes every earlier token out of date."""
        with self.lock:
            self._restores[session_id] = self.token(session_id) + 1
            yield

    def close(self) -> None:
        """Refuse every later step; blocking: waits for a step that holds the lock."""
        with self.lock:
            self._closed = True


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def summary_meta(layout: ClientLayout, session_id: str) -> dict[str, str]:
    """The front matter of the session's summary, or {} when there is none."""
    data = read_bytes(layout.summary_file(session_id))
    return read_front_matter(data.decode("utf-8", "replace")) if data else {}


def install_summary(
    layout: ClientLayout,
    session_id: str,
    text: str,
    source: Path,
    digest: str,
    guard: FileGuard,
    token: int,
    hook: StepHook | None = None,
) -> None:
    """Step 1: temp file in .memd/tmp, fsync, move into sessions/, fsync the folder.

    Only if `source` (the transcript summarised) is still what was summarised.
    """
    with guard.step(layout, session_id, token, "install", hook):
        data = read_bytes(source)
        if data is None or sha256(data) != digest:
            raise TranscriptChanged(f"{source.name} changed while it was summarised")
        layout.tmp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=layout.tmp_dir, prefix=f"{TMP_PREFIX}{session_id}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(text.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, layout.summary_file(session_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(layout.sessions)


def archive_transcript(
    layout: ClientLayout,
    session_id: str,
    digest: str,
    guard: FileGuard,
    token: int,
    hook: StepHook | None = None,
) -> None:
    """Step 2: move the transcript the summary was made from to archive/, fsync both.

    Then the base it may have been made from is dropped: the new summary replaced it.
    """
    with guard.step(layout, session_id, token, "archive", hook):
        live, dest = layout.session_file(session_id), layout.archive_file(session_id)
        data = read_bytes(live)
        if data is not None:
            if sha256(data) != digest:
                raise TranscriptChanged(f"{live.name} changed after it was summarised")
            layout.archive.mkdir(mode=0o700, parents=True, exist_ok=True)
            _set_aside(dest)
            os.replace(live, dest)
            fsync_dir(layout.archive)
            fsync_dir(layout.sessions)
        drop_base(layout, session_id)


def _set_aside(path: Path) -> None:
    """Keep an existing, different file at `path` as `<name>.prev-N` (never lose a transcript)."""
    if not path.exists():
        return
    n = 1
    while (aside := path.with_name(f"{path.name}.prev-{n}")).exists():
        n += 1
    os.replace(path, aside)
    log.warning("compaction.archive_set_aside", path=str(path), aside=str(aside))


def restore_files(layout: ClientLayout, session_id: str, guard: FileGuard | None = None) -> str:
    """Transcript from archive/ back into sessions/, then the summary kept aside as the base.

    The summary leaves sessions/ (a delete for the watcher: the session is not indexed
    twice) for `.memd/compaction-base/`, where the next compaction starts from it.
    Returns "restored", or "missing" when no transcript exists in either folder (then
    the summary, the only trace left, is kept). Idempotent. Under the file lock it also
    bumps the session's restore token, so no step of an earlier compaction runs after it.
    """
    with (guard or FileGuard()).restoring(session_id):
        live, arch = layout.session_file(session_id), layout.archive_file(session_id)
        summary = layout.summary_file(session_id)
        if arch.exists():
            if live.exists():  # both: the live one is the newer; keep the other aside
                _set_aside(arch)
            else:
                os.replace(arch, live)  # moved in from outside: a create for the watcher
                fsync_dir(layout.sessions)
            fsync_dir(layout.archive)
        elif not live.exists():
            return "missing"
        if summary.exists():
            base = base_file(layout, session_id)
            base.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.replace(summary, base)  # a delete for the watcher: its chunks are dropped
            fsync_dir(layout.sessions)
            fsync_dir(base.parent)
        return "restored"


def drop_base(layout: ClientLayout, session_id: str) -> None:
    """Remove the session's base once a newer summary is in place (under the file lock)."""
    base = base_file(layout, session_id)
    if base.exists():
        base.unlink()
        fsync_dir(base.parent)


def sweep_tmp(layout: ClientLayout, guard: FileGuard) -> int:
    """Remove what a crash left behind: summary temp files (only ours: other modules share
    tmp/) and bases whose session was compacted again before its base was dropped."""
    removed = 0
    for path in layout.tmp_dir.glob(f"{TMP_PREFIX}*.tmp"):
        path.unlink(missing_ok=True)
        removed += 1
    with guard.lock:
        for path in stale_bases(layout):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def compacted_ids(layout: ClientLayout) -> list[str]:
    """Sessions whose transcript is in archive/ and not live again in sessions/."""
    return sorted(
        p.stem for p in layout.archive.glob("*.md") if not layout.session_file(p.stem).exists()
    )
