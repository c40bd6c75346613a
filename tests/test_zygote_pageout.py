"""The zygote gives back the library pages its preload touched and no child maps
(memd.supervision.zygote_pageout, memd.heap.page_out_files): when, and that it still
forks working children afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memd.supervision.zygote_pageout import PageOut
from memd.supervision.zygote_spawner import ZYGOTE_NAME
from tests.support.processes import gone, wait_until
from tests.test_zygote import Rig

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the zygote needs PR_SET_CHILD_SUBREAPER"
)


def _kernel_pages_out(path: Path) -> bool:
    """Whether madvise(MADV_PAGEOUT) is there to call (glibc, Linux >= 5.4)."""
    import ctypes
    import mmap

    from memd import heap

    if not heap.available():
        return False
    libc = ctypes.CDLL("libc.so.6")
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), mmap.PAGESIZE, access=mmap.ACCESS_COPY) as m:
        view = ctypes.c_char.from_buffer(m)
        try:
            return libc.madvise(ctypes.addressof(view), mmap.PAGESIZE, heap.MADV_PAGEOUT) == 0
        finally:
            del view


def _rss_file_mb(pid: int) -> float:
    """MB of file-backed pages resident in `pid` (shared libraries, mapped files)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:")) / 1024


def test_the_zygote_gives_back_pages_its_preload_touched_and_still_forks(
    tmp_path: Path,
) -> None:
    """A library the preload read and no child maps stays resident in the zygote alone;
    once its children have started, the zygote has the kernel reclaim those pages (on a
    kernel with MADV_PAGEOUT), and forks working children afterwards."""
    mapped = tmp_path / "library.bin"
    with open(mapped, "wb") as f:
        f.write(os.urandom(16 << 20))
        os.fsync(f.fileno())  # clean pages: the kernel can drop them without writing
    if not _kernel_pages_out(mapped):
        pytest.skip("needs glibc and a kernel with MADV_PAGEOUT (Linux >= 5.4)")
    resident = {}
    for name, delay in (("kept", "3600"), ("given_back", "0.2")):
        rig = Rig(
            tmp_path / name,
            preload=("json", "tests.support.zygote_mapped"),
            zygote_args=("--page-out-delay", delay),
            zygote_env={"MEMD_TEST_MAPPED": str(mapped)},
        )
        try:
            rig.add("one")
            assert rig.ready("one")["pid"] == rig.pid("one")
            if name == "given_back":
                wait_until(lambda r=rig: "zygote_paged_out" in r.log("zygote"), timeout=30)
                rig.add("two")  # still forks, after giving pages back
                assert rig.ready("two")["pid"] == rig.pid("two")
            resident[name] = _rss_file_mb(rig.pid(ZYGOTE_NAME))
        finally:
            rig.close()
    assert resident["given_back"] < resident["kept"] - 12, resident


def _ticks_until_paged_out(pages: PageOut, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pages.tick():
            return True
        time.sleep(0.02)
    return False


def test_pages_go_back_after_a_fork_and_after_a_forked_child_exits() -> None:
    """Once after start, once after each fork, once after a child's exit (a parked
    watcher leaves its pages to the zygote alone); never while nothing changed."""
    pages = PageOut(delay=0.1)
    try:
        assert _ticks_until_paged_out(pages)  # after the preload
        assert not _ticks_until_paged_out(pages, timeout=0.5)  # nothing changed since
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        pages.forked(child.pid)
        assert _ticks_until_paged_out(pages)
        assert not _ticks_until_paged_out(pages, timeout=0.5)
        assert child.stdin is not None
        child.stdin.close()  # the child exits
        child.wait(timeout=30)
        assert _ticks_until_paged_out(pages)
        assert pages.done == 3
    finally:
        pages.close()


def _switches(pid: int) -> int:
    """Context switches of every thread of `pid` so far: each one is a wake-up."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def _quiet_for_a_second(pid: int) -> bool:
    before = _switches(pid)
    time.sleep(1.0)
    return _switches(pid) == before


def test_an_idle_zygote_sleeps_until_something_happens_and_still_stops(tmp_path: Path) -> None:
    """No timer wakes an idle zygote (it looked every second: a wake-up a second of memd's
    idle tree); a forked child's exit and a stop signal still reach it at once."""
    rig = Rig(tmp_path, zygote_args=("--page-out-delay", "0.2"))
    try:
        rig.add("one")
        rig.ready("one")
        zygote = rig.pid(ZYGOTE_NAME)
        # once the page-outs after the start and the fork are done, it wakes no more (with
        # a 1 s timer no second could pass without a wake-up)
        wait_until(lambda: _quiet_for_a_second(zygote), timeout=60)
        paged = rig.log("zygote").count("zygote_paged_out")
        assert asyncio.run(rig.sup.stop("one"))
        wait_until(lambda: rig.log("zygote").count("zygote_paged_out") > paged)
        os.kill(zygote, signal.SIGINT)
        wait_until(lambda: gone(zygote))
    finally:
        rig.close()
