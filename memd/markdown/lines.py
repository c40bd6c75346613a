"""A text file's lines, decoded one at a time when asked for (recall's transcript reader).

Recall needs a few lines around each hit of a transcript that can be megabytes long.
Splitting the whole file into line strings made tens of thousands of small objects per
recall, live all at once: under load they pushed Python's small-object allocator to new
arenas that other objects then pinned, and memd's RSS grew with the transcripts. Here the
file stays one bytes object plus an array of newline positions, and a line becomes a
string only when it is read.

`read_lines(path)` gives exactly `text.splitlines()` of the file decoded as UTF-8 with
replacement characters (memsearch's expand reads files that way, and its line numbers
must agree): files holding any line break other than "\\n" take that slow path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

# What str.splitlines() breaks on besides "\n": these single bytes, and U+0085, U+2028 and
# U+2029 (C2 85, E2 80 A8, E2 80 A9 in UTF-8). Messages rarely hold them, so the lazy path
# is the usual one; a transcript that does (pasted Windows text, say) is split as before.
_SINGLE_BYTE_BREAKS = (b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")


class FileLines(Sequence[str]):
    """Lines of UTF-8 bytes split at b"\\n" only; each decoded when indexed."""

    def __init__(self, data: bytes) -> None:
        import numpy as np

        self._data = data
        self._ends = np.flatnonzero(_as_array(data) == 0x0A)
        tail = 1 if data and not data.endswith(b"\n") else 0
        self._count = len(self._ends) + tail

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
        return int(self._ends[i]) if i < len(self._ends) else len(self._data)

    def _decode(self, start: int, end: int) -> str:
        return self._data[start:end].decode("utf-8", "replace")


def read_lines(path: Path) -> Sequence[str]:
    """The file's lines as `path.read_text(errors="replace").splitlines()` would give them."""
    return lines_of(path.read_bytes())


def lines_of(data: bytes) -> Sequence[str]:
    """`read_lines` of bytes already read (recall reads through a checked descriptor)."""
    if _has_other_breaks(data):
        return data.decode("utf-8", "replace").splitlines()
    return FileLines(data)


def _has_other_breaks(data: bytes) -> bool:
    """Vectorised: a regular expression took 50 ms on a 2 MB transcript, this about 2 ms."""
    if any(b in data for b in _SINGLE_BYTE_BREAKS):
        return True
    a = _as_array(data)
    nel = len(a) >= 2 and bool(((a[1:] == 0x85) & (a[:-1] == 0xC2)).any())
    separators = len(a) >= 3 and bool(
        (((a[2:] | 1) == 0xA9) & (a[1:-1] == 0x80) & (a[:-2] == 0xE2)).any()
    )
    return nel or separators


def _as_array(data: bytes) -> Any:
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8)
