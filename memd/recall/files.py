"""The transcripts a recall reads: only the lines it shows, read from the file itself.

A recall opens each file it shows once (memd.trust.open_served) and keeps the descriptor
until it ends (`LineCache.close`); a line is read with `os.pread` when asked for, through
a small window (`Window`) so that walking a few hundred lines up to a conversation's
header costs one read. What is kept between recalls is each recent file's newline
offsets (4 bytes a line) and identity (`Scanned`), never its text: a file unchanged since
is not read at all, and one that only grew is scanned from where it ended.

Why: recall read each transcript whole. Under an hour of bench/load.py (20 clients, each
with one session file growing to ~6 MB, two recalls in flight per client) those copies
were most of memd's 131 MB PSS (docs/performance.md, "An hour of bench/load.py"). Now a
recall holds a few windows of 64 KiB whatever the transcripts' size.

memd appends to transcripts and rewrites them by replacing the file (a new inode); a
failed append is truncated back in place. A file is taken as grown only when it has the
same device and inode, is larger, and still holds at the old end the bytes it ended with
(`TAIL`); anything else is scanned afresh. A file with line breaks other than "\\n" is
read whole and split as `str.splitlines` does (memd.markdown.lines), and not kept.
"""

from __future__ import annotations

import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from memd import trust
from memd.markdown import FileLines, has_other_breaks, lines_of, newlines

RECENT_FILES = 64
RECENT_BYTES = 4 * 1024 * 1024  # of newline offsets kept: ~1M lines (4 bytes each)
BLOCK = 1024 * 1024  # bytes scanned at a time for newlines
TAIL = 256  # bytes at a file's end that an append must leave in place
WINDOW = 64 * 1024  # bytes read around a line asked for


class LineCache:
    """One recall's files: each opened once, read line by line, closed by `close`."""

    def __init__(self, recent: RecentFiles) -> None:
        self._recent = recent
        self._lines: dict[Path, Sequence[str] | None] = {}  # None: not servable
        self._fds: list[int] = []

    def servable(self, path: Path) -> bool:
        """Open the file if recall may serve it (memd.trust.open_served); False if not."""
        if path in self._lines:
            return self._lines[path] is not None
        fd = trust.open_served(path)
        if fd is None:
            self._lines[path] = None
            return False
        self._fds.append(fd)
        try:
            self._lines[path] = self._recent.lines(path, fd)
        except OSError:
            self._lines[path] = None
        return self._lines[path] is not None

    def lines(self, path: Path) -> Sequence[str]:
        if not self.servable(path):
            return []
        return self._lines[path] or []

    def close(self) -> None:
        """Close every descriptor; the lines handed out cannot be read after this."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


class Window:
    """`read(start, end)` of a descriptor, through one buffer of about WINDOW bytes
    around the last range asked for (recall reads lines near each other)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lo = self._hi = 0
        self._buf = b""

    def __call__(self, start: int, end: int) -> bytes:
        if not (self._lo <= start and end <= self._hi):
            lo = max(0, start - WINDOW // 2)
            self._buf = os.pread(self._fd, max(end, lo + WINDOW) - lo, lo)
            self._lo, self._hi = lo, lo + len(self._buf)  # short at a truncated end
        return self._buf[start - self._lo : end - self._lo]


@dataclass(frozen=True)
class Scanned:
    """A file's newline offsets, and what it was when they were found."""

    key: tuple[int, int, int, int]  # device, inode, size, mtime (ns)
    ends: array[int]
    tail: bytes  # its last TAIL bytes

    @property
    def size(self) -> int:
        return self.key[2]

    def grown_to(self, key: tuple[int, int, int, int], fd: int) -> bool:
        """Whether the file `fd` (now `key`) is this one with lines appended."""
        return (
            key[:2] == self.key[:2]
            and key[2] > self.size
            and (not self.ends or self.ends[-1] == self.size - 1)
            and os.pread(fd, len(self.tail), self.size - len(self.tail)) == self.tail
        )


class RecentFiles:
    """The newline offsets of the last files recall read, kept between recalls; at most
    RECENT_FILES files and RECENT_BYTES bytes of offsets. One per daemon
    (memd.daemon.runtime), shared by every client's recall lane."""

    def __init__(self) -> None:
        self._files: OrderedDict[Path, Scanned] = OrderedDict()
        self._lock = threading.Lock()

    def lines(self, path: Path, fd: int) -> Sequence[str]:
        """The lines of `path`, open as `fd`, read from `fd` when asked for."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            kept = self._files.get(path)
            if kept is not None and kept.key == key:
                self._files.move_to_end(path)
                return FileLines.over(Window(fd), kept.ends, kept.size)
        scanned = scan(fd, key, kept if kept is not None and kept.grown_to(key, fd) else None)
        if scanned is None:  # other line breaks: the slow path, not kept
            return lines_of(os.pread(fd, key[2], 0))
        self._keep(path, scanned)
        return FileLines.over(Window(fd), scanned.ends, scanned.size)

    def kept(self, path: Path) -> Scanned | None:
        with self._lock:
            return self._files.get(path)

    def _keep(self, path: Path, scanned: Scanned) -> None:
        with self._lock:
            self._files[path] = scanned
            self._files.move_to_end(path)
            while len(self._files) > RECENT_FILES or self.held() > RECENT_BYTES:
                self._files.popitem(last=False)

    def held(self) -> int:
        """Bytes of newline offsets kept."""
        return sum(s.ends.itemsize * len(s.ends) for s in self._files.values())


def scan(fd: int, key: tuple[int, int, int, int], before: Scanned | None) -> Scanned | None:
    """The newline offsets of the file `fd` (`key`), BLOCK bytes at a time, from where
    `before` (the same file, shorter) ended; None if it holds another line break."""
    size = key[2]
    start = before.size if before is not None else 0
    ends: array[int] = array(_offsets(size), before.ends if before is not None else ())
    for lo, seen, block in _blocks(fd, start, size):
        if has_other_breaks(block):
            return None
        ends.extend(newlines(block, seen, lo))
    tail = os.pread(fd, min(TAIL, size), size - min(TAIL, size))
    return Scanned(key, ends, tail)


def _offsets(size: int) -> str:
    """The array type code for offsets into a file of `size` bytes: 4 bytes each below
    4 GiB (half of what 8 would hold in memory), 8 beyond."""
    return "I" if size < 2**32 and array("I").itemsize == 4 else "q"


def _blocks(fd: int, start: int, size: int) -> Iterator[tuple[int, int, bytes]]:
    """(offset, bytes seen before, block) from `start` to `size`, BLOCK bytes at a time;
    after the first, a block starts with the 2 bytes before it (seen before), so a
    multi-byte line break across two blocks is seen whole."""
    pos = start
    while pos < size:
        lo = max(start, pos - 2)
        block = os.pread(fd, min(BLOCK, size - pos) + (pos - lo), lo)
        if len(block) <= pos - lo:
            return  # truncated meanwhile: what is there is scanned
        yield lo, pos - lo, block
        pos = lo + len(block)
