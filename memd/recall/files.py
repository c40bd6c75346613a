"""The transcripts a recall reads: each file once per recall, the last few kept between
recalls while they stay unchanged (memd.recall.service)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from memd import trust
from memd.markdown import lines_of


class LineCache:
    """Each source file is read at most once per recall (lines decoded only when used)."""

    def __init__(self, recent: RecentFiles) -> None:
        self._recent = recent
        self._lines: dict[Path, Sequence[str] | None] = {}  # None: not servable

    def servable(self, path: Path) -> bool:
        """Read the file if recall may serve it (memd.trust.open_served); False if not."""
        if path in self._lines:
            return self._lines[path] is not None
        fd = trust.open_served(path)
        if fd is None:
            self._lines[path] = None
            return False
        try:
            with os.fdopen(fd, "rb") as fh:
                self._lines[path] = self._recent.lines(path, fh)
        except OSError:
            self._lines[path] = None
        return self._lines[path] is not None

    def lines(self, path: Path) -> Sequence[str]:
        if not self.servable(path):
            return []
        return self._lines[path] or []


class RecentFiles:
    """The last few files recall read, kept between recalls while they stay unchanged.

    A client with one long session file had every recall read and split it again (30 ms
    at p50 for a 4 MB transcript under load). A file is reused only when the descriptor
    recall just opened (memd.trust.open_served) shows the same device, inode, size and
    modification time; appending, rewriting or replacing it reads it afresh (after an
    append, only the new bytes are scanned for line breaks: `lines_of`). At most
    RECENT_FILES files and RECENT_BYTES bytes are kept.
    """

    def __init__(self) -> None:
        self._files: OrderedDict[Path, tuple[tuple[int, ...], int, Sequence[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def lines(self, path: Path, fh: BinaryIO) -> Sequence[str]:
        st = os.fstat(fh.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            kept = self._files.get(path)
            if kept is not None and kept[0] == key:
                self._files.move_to_end(path)
                return kept[2]
        data = fh.read()
        same_file = kept is not None and kept[0][:2] == key[:2]
        lines = lines_of(data, kept[2] if same_file and kept is not None else None)
        if len(data) <= RECENT_BYTES:
            with self._lock:
                self._files[path] = (key, len(data), lines)
                self._files.move_to_end(path)
                while len(self._files) > RECENT_FILES or (
                    sum(size for _, size, _ in self._files.values()) > RECENT_BYTES
                ):
                    self._files.popitem(last=False)
        return lines


RECENT_FILES = 4
RECENT_BYTES = 16 * 1024 * 1024
