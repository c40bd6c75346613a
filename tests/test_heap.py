"""memd.heap on this machine's glibc: a trim hands freed, fragmented heap memory back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

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
