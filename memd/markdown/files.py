"""Transcript files on disk: durable appends, crash reconciliation, archive moves."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from pathlib import Path

import structlog

from memd import trust
from memd.layout import ClientLayout
from memd.markdown.parse import parse_front_matter
from memd.trust import fsync_dir

log = structlog.get_logger()

SESSION_ID_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ-[0-9a-f]{4}$")
TAIL_BYTES = 64


def tail_digest(data: bytes) -> bytes:
    """Fingerprint of the last committed bytes, to tell our own unacknowledged tail from edits."""
    return hashlib.blake2b(data[-TAIL_BYTES:], digest_size=16).digest()


class AppendFile:
    """A transcript opened for appending; every append is fsynced before it returns.

    Not thread-safe: one owner (the client's writer thread) appends. If the path stops
    naming the file we hold open (the user deleted it, or an editor saved by rename),
    the next append reopens the path, so new exchanges never go to an unlinked inode.
    A file that is missing is created again with `header` (the front matter) first.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None

    def append(self, data: bytes, header: bytes) -> tuple[int, bytes]:
        """Append, fsync, and return the new size and the digest of the file's new tail."""
        fd, created = self._open()
        if created:
            data = header + data
        _write_all(fd, data)
        os.fdatasync(fd)
        if created:
            fsync_dir(self.path.parent)
        size = os.fstat(fd).st_size
        if len(data) >= TAIL_BYTES:
            return size, tail_digest(data)
        return size, tail_digest(os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES)))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._ino = None

    def _open(self) -> tuple[int, bool]:
        try:
            st = os.lstat(self.path)  # a symlink is not our file: never followed (memd.trust)
        except FileNotFoundError:
            st = None
        if self._fd is not None and st is not None and (st.st_dev, st.st_ino) == self._ino:
            return self._fd, False
        if self._fd is not None:
            log.warning("transcript.replaced_reopened", path=str(self.path))
        self.close()
        flags = os.O_RDWR | os.O_APPEND  # read: the tail digest
        if st is None:
            fd = trust.open_nofollow(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        else:
            fd = trust.open_nofollow(self.path, flags | os.O_NONBLOCK)  # a FIFO must not hang
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid():
            os.close(fd)
            raise trust.UntrustedPath(
                self.path,
                "is not a regular file of memd's uid",
                f"move it away: `mv {self.path} {self.path}.old`",
            )
        self._fd, self._ino = fd, (fst.st_dev, fst.st_ino)
        return fd, st is None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def reconcile(path: Path, committed: int, digest: bytes | None) -> str:
    """Cut a transcript back to what the state committed, after a crash between the two.

    Bytes past `committed` were written but never acknowledged (the process died before
    the state commit). They are removed only if the committed part still ends with the
    bytes the state remembers and the extra part starts like one of our blocks (a header,
    an exchange, or a message joining the open exchange); anything else is a person's
    edit and is left alone. Returns what was done.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size == committed:
        return "ok"
    if size < committed:
        log.warning(
            "transcript.shorter_than_recorded", path=str(path), size=size, committed=committed
        )
        return "shorter"
    with open(path, "rb") as fh:
        fh.seek(max(0, committed - TAIL_BYTES))
        before = fh.read(committed - max(0, committed - TAIL_BYTES))
        extra = fh.read(16)
    ours = extra.startswith((b"# Conversation ", b"## ", b"**"))  # header, exchange, part
    if not ours or digest is None or tail_digest(before) != digest:
        log.warning("transcript.edited_kept", path=str(path), size=size, committed=committed)
        return "edited"
    with open(path, "r+b") as fh:
        fh.truncate(committed)
        os.fsync(fh.fileno())
    log.info("transcript.tail_removed", path=str(path), removed=size - committed)
    return "truncated"


def is_orphan(path: Path, client_id: str) -> bool:
    """A session file memd created whose first commit never happened (front matter is ours)."""
    if not SESSION_ID_RE.match(path.stem):
        return False
    with open(path, "rb") as fh:
        head = fh.read(512).decode("utf-8", "replace")
    meta, _ = parse_front_matter(head.split("\n"))
    return meta.get("session_id") == path.stem and meta.get("client_id") == client_id


def restore(layout: ClientLayout, session_id: str) -> Path:
    """Move an archived transcript back into sessions/ (memsearch indexes it again)."""
    return _move(layout.archive_file(session_id), layout.session_file(session_id))


def _move(src: Path, dst: Path) -> Path:
    """Move a transcript between trusted folders: both real folders of ours, the source a
    regular file and the target no symlink (rename replaces a link, but the link's
    presence means someone else's hand was there)."""
    trust.ensure_dir(dst.parent)
    trust.check_dir(src.parent)
    if not trust.check_file(src, tighten=False):
        raise FileNotFoundError(errno.ENOENT, "no such transcript", str(src))
    trust.check_file(dst, tighten=False)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    fsync_dir(src.parent)
    return dst
