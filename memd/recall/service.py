"""One recall: the search on the client's lane, the expansion, the deadlines, the text.

Independent of the socket: `memd.api.recall` serves it as JSON-RPC, `memd.cli.mcp` over stdio.

A recall searches one client's index (the api hands in that client's own `IndexSearcher`)
on that client's lane (memd.recall.lane), keeps the relevant hits, expands the best of
them to their sections (memd.recall.expand) on the same thread, and returns at most
`CHAR_BUDGET` characters of text (memd.recall.output).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from memd.config import RecallConfig
from memd.indexing import Hit, IndexSearcher, IndexUnavailableError
from memd.indexing.query.ranking import query_weight
from memd.layout import ClientLayout
from memd.recall.expand import collect
from memd.recall.files import RecentFiles
from memd.recall.lane import LANE_WAITING, RecallLane
from memd.recall.output import CHAR_BUDGET, Memory, render

RECALL_TIMEOUT = 10.0  # seconds for one search, embedding included
OVERFETCH = 2  # front-matter chunks and chunks of one section are dropped after the search


class RecallTimeoutError(Exception):
    """The index answered but expanding its hits outran the deadline: the daemon is
    overloaded (its threads are busy), which is neither the index's fault nor a bug."""


async def recall(
    searcher: IndexSearcher | None,
    query: str,
    top_k: int,
    after: datetime | None,
    before: datetime | None,
    layout: ClientLayout,
    *,
    timeout: float = RECALL_TIMEOUT,
    budget: int = CHAR_BUDGET,
    waiting: int | None = None,
    settings: RecallConfig | None = None,
    lane: RecallLane | None = None,
) -> dict[str, Any]:
    """Search the client's index, expand the best hits, return `results` and `text`.

    `settings` (the config's `[recall]`) weighs the two halves of the search (the query's
    own weight: `ranking.query_weight`) and sets the relevance below which results are
    dropped, and below which nothing is returned.

    Raises IndexUnavailableError when there is no searcher yet, the index does not answer,
    or the search overruns `timeout` (the thread is then abandoned, never awaited),
    RecallTimeoutError when reading the transcripts then overruns `timeout`, and
    RecallBusyError when `waiting` recalls (default LANE_WAITING; `limits.recall_queue`)
    already wait behind the client's running ones on its `lane` (without one, the search
    gets threads of its own for this call).
    """
    if searcher is None:
        raise IndexUnavailableError("the memory index is starting")
    settings = settings or RecallConfig()
    own = lane or RecallLane()
    period = (after, before)
    job = _Recall(searcher, query, top_k, period, layout, settings, own.recent, timeout)
    try:
        future = own.submit(job.run, LANE_WAITING if waiting is None else waiting)
        shown = await _answer(future, lambda: job.searched, timeout)
    finally:
        if lane is None:
            own.close()
    return render(shown, budget)


@dataclasses.dataclass
class _Recall:
    """One recall's work on a lane thread: the search, then reading the transcripts.

    Both run on the same thread, one after the other: handing the hits back to the
    event loop and the reading on to another thread cost two thread wake-ups, 6-13 ms of
    a recall at 10k exchanges on a loaded machine (docs/quality.md, "Recall latency").
    `searched` is when the search ended (monotonic), for `_answer`'s second deadline."""

    searcher: IndexSearcher
    query: str
    top_k: int
    period: tuple[datetime | None, datetime | None]
    layout: ClientLayout
    settings: RecallConfig
    files: RecentFiles
    timeout: float
    searched: float | None = None

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def run(self) -> list[Memory]:
        after, before = self.period
        hits = _search_by(
            self.deadline,
            self.searcher,
            self.query,
            self.top_k * OVERFETCH + 1,
            after,
            before,
            query_weight(
                self.query, self.settings.bm25_weight, self.settings.inference_bm25_weight
            ),
        )
        self.searched = time.monotonic()
        hits = relevant(hits, self.settings.min_score, self.settings.drop_below)
        return collect(
            hits,
            self.layout,
            self.top_k,
            self.settings.follow_questions,
            self.settings.neighbours,
            files=self.files,
            context_chars=self.settings.context_chars,
            period=self.period,
        )


async def _answer(
    future: asyncio.Future[list[Memory]], searched: Callable[[], float | None], timeout: float
) -> list[Memory]:
    """The job's memories. IndexUnavailableError when its search has not ended within
    `timeout` (and a second's grace: the search has its own deadline), RecallTimeoutError
    when reading the transcripts outruns `timeout` from the search's end (`searched`, a
    monotonic time): the index answered, memd's threads are too busy (overload, neither
    the index's fault nor a bug)."""
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout + 1.0)
    except TimeoutError:
        ended = searched()
        if ended is None:
            raise IndexUnavailableError(
                f"the memory index did not answer within {timeout:g} s"
            ) from None
    try:
        left = ended + timeout - time.monotonic()
        return await asyncio.wait_for(asyncio.shield(future), max(left, 0.0))
    except TimeoutError:
        raise RecallTimeoutError(
            f"reading the matching transcripts took over {timeout:g} s (memd is overloaded)"
        ) from None


def _search_by(
    deadline: float,
    searcher: IndexSearcher,
    query: str,
    fetch: int,
    after: datetime | None,
    before: datetime | None,
    bm25_weight: float,
) -> list[Hit]:
    """Runs on a lane thread, maybe after a wait in the lane's queue: search in the time
    that is left, so a busy lane never starts work its caller has stopped waiting for."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise IndexUnavailableError("the recall waited its whole timeout behind earlier ones")
    return searcher.search(
        query, fetch, after=after, before=before, timeout=left, bm25_weight=bm25_weight
    )


def relevant(hits: Sequence[Hit], min_score: float, drop_below: float) -> list[Hit]:
    """Nothing when no hit reaches `min_score` (the memory does not hold what was asked);
    otherwise the hits, best first, without those under `drop_below`."""
    if not any(h.score >= min_score for h in hits):
        return []
    return [h for h in hits if h.score >= drop_below]
