"""Each client's recall lane: its own threads for its searches (memd.recall.service).

A hung index server ties up only its client's two threads, never those of other
clients' recalls or of anything else on the event loop's executor.

The threads end when the lane has been idle for `LANE_IDLE_SECONDS`, and the next recall
starts new ones. Each thread that ran a recall keeps glibc's per-thread cache of freed
blocks (tcache) and its stack's touched pages for as long as it lives: 40 lanes' threads
at 20 clients held ~6 MB of memd after `bench/load.py` (85 -> 79 MB PSS 150 s after five
minutes of it; issue 29, docs/performance.md, "What memd holds after load, round 3"). A
thread costs ~0.1 ms to start, once per recall after a quiet spell.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from memd.recall.caches import RecallCaches

T = TypeVar("T")


class RecallBusyError(Exception):
    """The client's recall lane is full: overload (kind `busy`), not an index fault."""


LANE_THREADS = 2  # searches of one client at once
# More may queue: a busy gateway has a few connections per client, each with a recall in
# flight. Past that a recall fails at once; queued ones that outwait their deadline give up.
LANE_WAITING = 16
LANE_IDLE_SECONDS = 30.0  # after the last recall, the lane's threads end


class RecallLane:
    """One client's own search threads: a hung index server ties up only these, never the
    threads other clients' recalls (or anything else on the loop's executor) need.

    Owned by the client's runtime (memd.daemon.runtime) and closed with it. `caches` is
    what recall keeps between recalls (memd.recall.caches): the daemon hands every lane
    the same, so it is bounded once for memd, not once per client (an hour of
    bench/load.py at 20 clients, one 16 MB budget of transcripts per lane: memd 51 -> 271
    MB PSS, still rising); its memos are let go when no lane has run a recall for a while.
    """

    def __init__(
        self, caches: RecallCaches | None = None, idle_seconds: float = LANE_IDLE_SECONDS
    ) -> None:
        self.pool = _threads()
        self.busy = 0  # submitted and not finished: running or queued
        self._own_caches = caches is None  # a lane of its own (one recall, a tool): closed with it
        self.caches = caches if caches is not None else RecallCaches()
        self.recent = self.caches.recent
        self._idle_seconds = idle_seconds
        self._retire: asyncio.TimerHandle | None = None
        self._closed = False

    def submit(self, fn: Callable[[], T], waiting: int) -> asyncio.Future[T]:
        """`fn` on the lane; RecallBusyError when `waiting` calls already wait."""
        if self.busy >= LANE_THREADS + waiting:
            raise RecallBusyError(
                f"{self.busy} recalls of this client are already running or waiting "
                f"(limits.recall_queue = {waiting})"
            )
        self._cancel_retire()
        self.busy += 1
        self.caches.started()
        future = asyncio.get_running_loop().run_in_executor(self.pool, fn)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: asyncio.Future[Any]) -> None:
        """On the event loop (as `submit`), so `busy` and the timer need no lock."""
        self.busy -= 1
        self.caches.ended()
        if self.busy == 0 and not self._closed:
            loop = asyncio.get_running_loop()
            self._retire = loop.call_later(self._idle_seconds, self._retire_threads)

    def _retire_threads(self) -> None:
        """Idle for `idle_seconds`: a fresh pool (it starts threads only when used) takes
        the next recall, and the old one's idle threads end."""
        self._retire = None
        if self.busy or self._closed:
            return
        old, self.pool = self.pool, _threads()
        old.shutdown(wait=False)

    def _cancel_retire(self) -> None:
        if self._retire is not None:
            self._retire.cancel()
            self._retire = None

    def close(self) -> None:
        """Drop what waits; a search that runs ends on its own (it has a deadline)."""
        self._closed = True
        self._cancel_retire()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self._own_caches:  # else the daemon's, which outlive every lane
            self.caches.close()


def _threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(LANE_THREADS, thread_name_prefix="memd-recall")
