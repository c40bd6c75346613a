"""memd.heap on this machine's glibc: a trim hands freed, fragmented heap memory back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from memd import heap

pytestmark = pytest.mark.skipif(not heap.available(), reason="needs glibc")

# Many threads allocate chunks that go to malloc (over pymalloc's 512 bytes), each in its
# own arena; one in fifty stays alive, so the arenas cannot shrink from the top on their own.
PROGRAM = textwrap.dedent("""
    import json, threading, psutil
    from memd import heap

    keep = []
    def churn():
        mine = [bytes(2000) for _ in range(20_000)]
        keep.extend(mine[::50])
    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    before = psutil.Process().memory_info().rss
    released = heap.trim()
    after = psutil.Process().memory_info().rss
    print(json.dumps({"before": before, "after": after, "released": released,
                      "kept": len(keep)}))
""")


def test_trim_gives_freed_fragmented_memory_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(out.stdout)
    assert figures["kept"] == 8 * 400
    assert figures["released"] is True
    # 8 x 20,000 x 2 kB = 320 MB went through malloc; 98% of it is free again
    assert figures["before"] - figures["after"] > 100 * 2**20, figures


def test_limiting_arenas_is_accepted() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from memd import heap; print(heap.limit_arenas(2))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "True"


# glibc raises its mmap threshold to the size of any mapped block that is freed; memd fixes
# it, so a large buffer allocated after a larger one was freed is still mapped on its own
# (given back whole when freed) instead of landing in an arena.
THRESHOLD_PROGRAM = textwrap.dedent("""
    import ctypes, json, sys
    from memd import heap

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "tuned":
        heap.limit_arenas()
    libc.free(libc.malloc(4 << 20))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(1 << 20)
    print(json.dumps({"mapped": libc.mallinfo2().hblkhd - before}))
""")


@pytest.mark.parametrize(("mode", "mapped"), [("tuned", True), ("glibc default", False)])
def test_large_blocks_stay_mapped_after_a_larger_one_is_freed(mode: str, mapped: bool) -> None:
    out = subprocess.run(
        [sys.executable, "-c", THRESHOLD_PROGRAM, mode.split()[0]],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (json.loads(out.stdout)["mapped"] >= 1 << 20) is mapped, out.stdout


# What SQLite itself holds for ten connections that each read a table, with and without
# memd.heap.sqlite_pages_on_demand; and that it leaves a library in use alone.
SQLITE_PROGRAM = textwrap.dedent("""
    import ctypes, json, sqlite3, sys, tempfile
    from memd import heap

    on_demand = heap.sqlite_pages_on_demand() if sys.argv[1] == "on" else None
    lib = ctypes.CDLL([l.split()[-1] for l in open("/proc/self/maps") if "/libsqlite3" in l][0])
    used, high = ctypes.c_int64(), ctypes.c_int64()
    path = tempfile.mktemp()
    conns = [sqlite3.connect(path) for _ in range(10)]
    conns[0].execute("CREATE TABLE t (a)")
    conns[0].executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
    conns[0].commit()
    rows = [c.execute("SELECT count(*) FROM t").fetchone()[0] for c in conns]
    lib.sqlite3_status64(0, ctypes.byref(used), ctypes.byref(high), 0)
    again = heap.sqlite_pages_on_demand()  # a connection is open: refused
    print(json.dumps({"on_demand": on_demand, "again": again, "rows": rows,
                      "used": used.value}))
""")


def _sqlite_figures(mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", SQLITE_PROGRAM, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout)
    return figures


def test_sqlite_allocates_cache_pages_as_used_not_twenty_a_connection() -> None:
    plain, on_demand = _sqlite_figures("off"), _sqlite_figures("on")
    if on_demand["on_demand"] is False:
        pytest.skip("this Python's sqlite3 is not linked to a shared libsqlite3")
    assert on_demand["on_demand"] is True and on_demand["again"] is False
    assert plain["rows"] == on_demand["rows"] == [1000] * 10
    # ~108 KB a connection before, ~30 KB after (20 pages of ~4 KB no longer allocated)
    assert plain["used"] - on_demand["used"] > 10 * 60_000, (plain, on_demand)
