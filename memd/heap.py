"""glibc heap settings for the long-running daemon: fewer malloc arenas, and a periodic trim.

Measured under `bench/load.py` (20 clients, think 1 s), memd's RSS kept climbing while the
Python heap (tracemalloc) stayed flat: glibc's `mallinfo2()` showed ~80 MB of *free* memory
held inside malloc's arenas, up to 8 per core, one picked per thread (memd runs ~70 threads:
per-client writers, search lanes, the embedding endpoint, gRPC). Freed chunks in the middle
of an arena are not returned to the kernel on their own. Three calls address it:

- `mallopt(M_ARENA_MAX, 2)` before the threads start, so freed memory is reused by the
  next thread instead of sitting in an arena that thread never touches again;
- `mallopt(M_MMAP_THRESHOLD, 256 KiB)`: glibc otherwise raises the threshold to the size
  of every large block it frees (up to 32 MB), after which large short-lived buffers
  (a transcript read by recall, a big request line, a growing dict's table) land inside
  the arenas and leave holes between long-lived small blocks; fixed, they are mapped
  and unmapped on their own;
- `malloc_trim(0)` now and then, which gives every whole free page back (MADV_DONTNEED).

All are glibc-only; elsewhere (macOS, musl) they are no-ops and say so. `tune()` does them
all and is called first thing by memd and by the index server and watcher it runs.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

M_MMAP_THRESHOLD = -3  # from glibc's malloc.h
M_ARENA_MAX = -8
ARENAS = 2
MMAP_THRESHOLD = 256 * 1024  # bytes; setting it also turns glibc's dynamic threshold off
TRIM_INTERVAL = 60.0  # seconds between trims; a trim of a ~150 MB heap takes milliseconds


def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - musl and others lack it
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


def available() -> bool:
    """Whether this process runs on glibc, where the calls below do something."""
    return _LIBC is not None


def limit_arenas(arenas: int = ARENAS, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Cap malloc's arenas and fix its mmap threshold; call before starting threads
    (existing arenas stay)."""
    return (
        _LIBC is not None
        and _LIBC.mallopt(M_ARENA_MAX, arenas) == 1
        and _LIBC.mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1
    )


def trim() -> bool:
    """Return free heap pages to the kernel; True if any memory was released."""
    return _LIBC is not None and _LIBC.malloc_trim(0) == 1


def tune(interval: float = TRIM_INTERVAL) -> bool:
    """Limit arenas and trim every `interval` seconds on a daemon thread, for the life of
    the process; False (and nothing started) where the allocator is not glibc's."""
    if _LIBC is None:
        return False
    limit_arenas()
    threading.Thread(
        target=_trim_forever, args=(interval,), name="memd-heap-trim", daemon=True
    ).start()
    return True


def _trim_forever(interval: float) -> None:
    stop = threading.Event()  # never set: the thread ends with the process
    while not stop.wait(interval):
        trim()
