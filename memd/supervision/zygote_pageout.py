"""When the zygote gives back the library pages it no longer needs (memd.heap.page_out_files).

The zygote imports everything its children run, then only forks: the code and constants
of pyarrow, pandas, faiss, pydantic_core... that its imports touched stay resident in it
alone (measured: ~40 MB of its ~57 MB USS, docs/performance.md). The kernel reclaims a
page only if no other process maps it, so the moment matters: right after the preload
the children have not mapped what they use yet, and each would read it back from disk.
So the zygote pages out `delay` seconds after it last forked a child (which by then has
mapped what it runs) and after a child it forked exited (a parked watcher leaves its
pages to the zygote alone). A child's exit is seen through a pidfd, polled from the
zygote's existing one-second wait: no thread and no extra wake-up.
"""

from __future__ import annotations

import contextlib
import os
import select
import time

from memd import heap

PAGE_OUT_DELAY = 10.0  # seconds after the last fork or a forked child's exit


def pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (readable once it exited), None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class PageOut:
    """Schedules `heap.page_out_files()`; `tick()` is called when the zygote wakes: at the
    time `wait()` gave, or when one of `fds()` (the forked children's pidfds) is readable."""

    def __init__(self, delay: float = PAGE_OUT_DELAY) -> None:
        self.delay = delay
        self.due: float | None = time.monotonic() + delay
        self.done = 0  # page-outs so far (the zygote's log says so)
        self._children: dict[int, int] = {}  # pid -> pidfd

    def forked(self, pid: int) -> None:
        """A child was forked: page out once it has started."""
        with contextlib.suppress(OSError, AttributeError):  # gone already; no pidfd_open
            self._children[pid] = os.pidfd_open(pid)
        self._schedule()

    def fds(self) -> list[int]:
        """The forked children's pidfds: readable once the child exited."""
        return list(self._children.values())

    def wait(self) -> float | None:
        """Seconds until the next page-out is due (None: none is)."""
        return None if self.due is None else max(self.due - time.monotonic(), 0.0)

    def tick(self) -> bool:
        """Notice exited children; page out if it is time. True if it paged out."""
        if self._children:
            exited, _, _ = select.select(list(self._children.values()), [], [], 0)
            for pid, fd in list(self._children.items()):
                if fd in exited:
                    os.close(self._children.pop(pid))
                    self._schedule()
        if self.due is None or time.monotonic() < self.due:
            return False
        self.due = None
        heap.page_out_files()
        self.done += 1
        return True

    def close(self) -> None:
        for fd in self._children.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._children.clear()

    def _schedule(self) -> None:
        self.due = time.monotonic() + self.delay
