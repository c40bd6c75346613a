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

`sqlite_pages_on_demand()` (memd only, before its first connection) stops SQLite from
allocating 20 cache pages for every connection it opens: memd has three a client.

`page_out_files()` is the zygote's (memd.supervision.zygote): its imports leave ~40 MB of
shared-library pages resident (pyarrow, pandas, faiss, pydantic_core) that it never runs
again and no child maps; `madvise(MADV_PAGEOUT)` has the kernel reclaim them now. A
page another process maps is left alone (the kernel's rule), and a page is only ever
re-read from its file when touched again, so nothing changes but where memory sits.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

M_MMAP_THRESHOLD = -3  # from glibc's malloc.h
MADV_PAGEOUT = 21  # from linux/mman.h (Linux >= 5.4)
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
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
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


SQLITE_CONFIG_PAGECACHE = 7  # from sqlite3.h


def sqlite_pages_on_demand(maps: str = "/proc/self/maps") -> bool:
    """Have SQLite allocate each connection's cache pages as they are used, not 20 at
    once: each of memd's connections (three a client) then costs ~30 KB instead of
    ~108 KB (7.8 MB of memd's 59 at 20 idle clients, `sqlite3_status64`). Call before
    any connection is opened. Only where Python's sqlite3 uses a shared libsqlite3 (a
    copy linked into the module cannot be reached); False, and nothing changed, elsewhere.
    """
    import sqlite3  # noqa: F401 - maps the library the module is linked to

    with open(maps, encoding="utf-8", errors="replace") as f:
        paths = {line.split()[-1] for line in f if "/libsqlite3" in line}
    if len(paths) != 1:
        return False
    try:
        lib = ctypes.CDLL(paths.pop())
    except OSError:
        return False
    used, high = ctypes.c_int64(), ctypes.c_int64()
    if lib.sqlite3_status64(0, ctypes.byref(used), ctypes.byref(high), 0) or used.value:
        return False  # SQLITE_STATUS_MEMORY_USED > 0: a connection is open; leave it be
    # The module's import initialised the library and nothing uses it yet, so it can be
    # shut down, configured and initialised again (the order sqlite3_config requires).
    if lib.sqlite3_shutdown() != 0:
        return False
    done = lib.sqlite3_config(SQLITE_CONFIG_PAGECACHE, None, ctypes.c_int(0), ctypes.c_int(0))
    return lib.sqlite3_initialize() == 0 and done == 0


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


def page_out_files(maps: str = "/proc/self/maps") -> int | None:
    """Ask the kernel to reclaim this process's pages of read-only file mappings (shared
    libraries' code and constants) that no other process maps; the mappings stay, a page
    touched again is read back. Returns how many mappings were advised, None where the
    call does not exist (not glibc, or a kernel before 5.4)."""
    if _LIBC is None:
        return None
    advised = failed = 0
    with open(maps, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/") or "w" in parts[1]:
                continue  # anonymous, [heap]/[stack]/[vdso], or writable
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if _LIBC.madvise(start, end - start, MADV_PAGEOUT) == 0:
                advised += 1
            else:
                failed += 1  # EINVAL: a kernel without MADV_PAGEOUT, or a device mapping
    return None if failed and not advised else advised
