"""Each client's recall lane: its own threads for its searches (memd.recall.service).

A hung index server ties up only its client's two threads, never those of other
clients' recalls or of anything else on the event loop's executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from memd.recall.files import RecentFiles

T = TypeVar("T")


class RecallBusyError(Exception):
    """The client's recall lane is full: overload (kind `busy`), not an index fault."""


LANE_THREADS = 2  # searches of one client at once
# More may queue: a busy gateway has a few connections per client, each with a recall in
# flight. Past that a recall fails at once; queued ones that outwait their deadline give up.
LANE_WAITING = 16


class RecallLane:
    """One client's own search threads: a hung index server ties up only these, never the
    threads other clients' recalls (or anything else on the loop's executor) need.

    Owned by the client's runtime (memd.daemon.runtime) and closed with it. `recent` is
    the transcripts kept between recalls: the daemon hands every lane the same one, so
    their bytes are bounded once for memd, not once per client (an hour of bench/load.py
    at 20 clients, one 16 MB budget per lane: memd 51 -> 271 MB PSS, still rising).
    """

    def __init__(self, recent: RecentFiles | None = None) -> None:
        self.pool = ThreadPoolExecutor(LANE_THREADS, thread_name_prefix="memd-recall")
        self.busy = 0  # submitted and not finished: running or queued
        self.recent = recent if recent is not None else RecentFiles()

    def submit(self, fn: Callable[[], T], waiting: int) -> asyncio.Future[T]:
        """`fn` on the lane; RecallBusyError when `waiting` calls already wait."""
        if self.busy >= LANE_THREADS + waiting:
            raise RecallBusyError(
                f"{self.busy} recalls of this client are already running or waiting "
                f"(limits.recall_queue = {waiting})"
            )
        self.busy += 1
        future = asyncio.get_running_loop().run_in_executor(self.pool, fn)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: asyncio.Future[Any]) -> None:
        self.busy -= 1

    def close(self) -> None:
        """Drop what waits; a search that runs ends on its own (it has a deadline)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
