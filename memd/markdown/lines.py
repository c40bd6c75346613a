"""A text file's lines, decoded one at a time when asked for (recall's transcript reader).

Recall needs a few lines around each hit of a transcript that can be megabytes long.
Splitting the whole file into line strings made tens of thousands of small objects per
recall, live all at once: under load they pushed Python's small-object allocator to new
arenas that other objects then pinned, and memd's RSS grew with the transcripts. Here a
file is an array of newline positions and a way to read bytes (the file's bytes in
memory, or, for recall, the file itself: `FileLines.over`), and a line becomes a string
only when it is read.

`read_lines(path)` gives exactly `text.splitlines()` of the file decoded as UTF-8 with
replacement characters (memsearch's expand reads files that way, and its line numbers
must agree): files holding any line break other than "\\n" take that slow path.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

# What str.splitlines() breaks on besides "\n": these single bytes, and U+0085, U+2028 and
# U+2029 (C2 85, E2 80 A8, E2 80 A9 in UTF-8). Messages rarely hold them, so the lazy path
# is the usual one; a transcript that does (pasted Windows text, say) is split as before.
_SINGLE_BYTE_BREAKS = (b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_OTHER_BREAKS = (*_SINGLE_BYTE_BREAKS, b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")
_NEWLINE = re.compile(b"\n")


class FileLines(Sequence[str]):
    """Lines of UTF-8 bytes split at b"\\n" only; each decoded when indexed."""

    def __init__(self, data: bytes) -> None:
        self._read: Callable[[int, int], bytes] = lambda start, end: data[start:end]
        self._size = len(data)
        self._ends: array[int] = array("q", newlines(data))
        self._count = _count(self._ends, self._size)

    @classmethod
    def over(cls, read: Callable[[int, int], bytes], ends: array[int], size: int) -> FileLines:
        """The lines of a file of `size` bytes whose newlines are at `ends`, each read with
        `read(start, end)` when asked for: recall reads only the lines it shows from the
        file itself (memd.recall.files), not the whole file into memory."""
        lines = cls.__new__(cls)
        lines._read, lines._size, lines._ends = read, size, ends
        lines._count = _count(ends, size)
        return lines

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if start >= stop:
                return []
            return self._decode(self._start(start), self._end(stop - 1)).split("\n")
        i = index + self._count if index < 0 else index
        if not 0 <= i < self._count:
            raise IndexError("line index out of range")
        return self._decode(self._start(i), self._end(i))

    def _start(self, i: int) -> int:
        return 0 if i == 0 else int(self._ends[i - 1]) + 1

    def _end(self, i: int) -> int:
        return int(self._ends[i]) if i < len(self._ends) else self._size

    def _decode(self, start: int, end: int) -> str:
        return self._read(start, end).decode("utf-8", "replace")


def newlines(data: bytes, start: int = 0, offset: int = 0) -> Iterator[int]:
    """The positions of b"\\n" in `data` from `start`, plus `offset`. One match object
    alive at a time: ~5 ms for a 2.4 MB transcript (numpy took ~1 ms, but importing it
    cost memd ~12 MB of its ~50 MB; issue 29)."""
    return (m.start() + offset for m in _NEWLINE.finditer(data, start))


def _count(ends: array[int], size: int) -> int:
    """Lines in a file of `size` bytes with newlines at `ends`: a last line without a
    newline counts too."""
    return len(ends) + (1 if size and (not ends or ends[-1] != size - 1) else 0)


def read_lines(path: Path) -> Sequence[str]:
    """The file's lines as `path.read_text(errors="replace").splitlines()` would give them."""
    return lines_of(path.read_bytes())


def lines_of(data: bytes) -> Sequence[str]:
    """`read_lines` of bytes already read."""
    if has_other_breaks(data):
        return data.decode("utf-8", "replace").splitlines()
    return FileLines(data)


def has_other_breaks(data: bytes) -> bool:
    """Substring searches in C (a regular expression took 50 ms on a 2 MB transcript);
    ASCII text, checked fastest of all, cannot hold the multi-byte ones. In UTF-8 the lead
    bytes C2 and E2 never continue a character, so each multi-byte sequence found is
    that very character."""
    breaks = _SINGLE_BYTE_BREAKS if data.isascii() else _OTHER_BREAKS
    return any(b in data for b in breaks)
