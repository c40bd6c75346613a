"""Changes under a few folders, read by the event loop from one inotify fd (Linux).

watchfiles runs its watch on a thread that wakes every `step` to look at its stop event:
memd's watch of every client's `sessions/` cost a wake-up a second while nothing at all
happened. Here the kernel's inotify fd is one more reader of the event loop, so an idle
watch costs nothing. Folders are watched with their subfolders (new ones are added as
they appear); where inotify is missing (`available()` is False) callers keep watchfiles.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import struct
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

# <sys/inotify.h>
_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800  # writes, moves, ...
_IN_IGNORED, _IN_ISDIR, _IN_CREATE, _IN_MOVED_TO = 0x8000, 0x40000000, 0x100, 0x80
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, getattr(os, "O_CLOEXEC", 0o2000000)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return libc if hasattr(libc, "inotify_init1") else None


_LIBC = _libc()


def available() -> bool:
    return _LIBC is not None


class DirEvents:
    """One inotify fd over `folders` and their subfolders; `changes()` yields the paths
    that changed, a batch per read. `close()` ends it."""

    def __init__(self, folders: Sequence[Path]) -> None:
        assert _LIBC is not None, "inotify is not available: check available() first"
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._fd = fd
        self._dirs: dict[int, Path] = {}  # watch descriptor -> folder
        self._roots = {Path(f) for f in folders}
        self._queue: asyncio.Queue[set[Path] | None] = asyncio.Queue()
        self._reading = False
        for folder in folders:
            self._add_tree(Path(folder))

    def _add(self, folder: Path) -> None:
        assert _LIBC is not None
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(folder), _MASK)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")
        self._dirs[wd] = folder

    def _add_tree(self, folder: Path) -> None:
        self._add(folder)
        for root, dirs, _ in os.walk(folder):
            for name in dirs:
                with contextlib.suppress(OSError):  # gone meanwhile
                    self._add(Path(root) / name)

    async def changes(self) -> AsyncIterator[set[Path]]:
        """Batches of changed paths until `close()` or until a watched root is gone."""
        loop = asyncio.get_running_loop()
        fd = self._fd
        if fd < 0:
            return
        loop.add_reader(fd, self._read)
        self._reading = True
        try:
            while (batch := await self._queue.get()) is not None:
                yield batch
        finally:
            loop.remove_reader(fd)
            self._reading = False
            self._release()

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        changed: set[Path] = set()
        gone = False
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            folder = self._dirs.get(wd)
            if folder is None:
                continue
            if mask & _IN_IGNORED:  # the folder itself went away
                del self._dirs[wd]
                gone |= folder in self._roots
                continue
            path = folder / os.fsdecode(name) if name else folder
            changed.add(path)
            if mask & _IN_ISDIR and mask & (_IN_CREATE | _IN_MOVED_TO):
                with contextlib.suppress(OSError):
                    self._add_tree(path)
        if changed:
            self._queue.put_nowait(changed)
        if gone:
            self._queue.put_nowait(None)

    def close(self) -> None:
        """End `changes()` (which then releases the fd), or release it now."""
        self._queue.put_nowait(None)
        if not self._reading:
            self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
