"""What recall keeps between recalls, for every client at once, and when it lets go of it.

Between one recall and the next, memd keeps what makes the next one cheap: what the query
path computed from its candidates' texts (their terms, the dates they say, their parsed
headings: memd.indexing.query.memo and `memd.markdown.parse_exchange_heading`, ~11 MB
full) and the newline offsets of recent transcripts (`RecentFiles`, up to 4 MB). A
burst of recalls hits them again and again. After the burst they stayed full for good:
memd went from 34 MB PSS idle to 60-64 MB 150 s after five minutes of `bench/load.py` at
20 clients (issue 29, docs/performance.md, "memd at rest and after load, round 4").

So the memos are dropped once no client has recalled for `IDLE_SECONDS`, and the heap is
trimmed; a recall after the spell computes them again for its own candidates (no slower
at the median on 10k exchanges, `bench/recall.py --questions`). Kept: the offsets, which
spare a recall reading a long transcript through again (dropping them too made every
such recall 31 ms slower at the median on one 10k-exchange session), and the words'
stems (memd.indexing.analysis.stem), the vocabulary every recall needs, ≤ 2.8 MB.
"""

from __future__ import annotations

import asyncio

from memd import heap
from memd.indexing.query import memo
from memd.markdown import parse_exchange_heading
from memd.recall.files import RecentFiles

IDLE_SECONDS = 60.0  # after the last recall of any client, the memos are dropped


class RecallCaches:
    """The daemon's one set of recall caches (memd.daemon.runtime), shared by every
    client's lane (memd.recall.lane), which reports each recall's start and end on the
    event loop, so the count and the timer need no lock."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.recent = RecentFiles()
        self.running = 0  # recalls started and not ended, over every client
        self.releases = 0  # how many times the memos were let go (tests)
        self._idle_seconds = idle_seconds
        self._release: asyncio.TimerHandle | None = None
        self._closed = False

    def started(self) -> None:
        """A recall starts: whatever was to be dropped is kept."""
        self.running += 1
        if self._release is not None:
            self._release.cancel()
            self._release = None

    def ended(self) -> None:
        """A recall ended; the last one running starts the idle spell."""
        self.running -= 1
        if self.running == 0 and self._release is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._release = loop.call_later(self._idle_seconds, self.release)

    def release(self) -> None:
        """Drop the memos and give the heap's free pages back."""
        self._release = None
        if self.running:
            return
        memo.clear_all()
        parse_exchange_heading.cache_clear()
        heap.trim()
        self.releases += 1

    def close(self) -> None:
        """No release from now on (a recall that ends later arms no timer)."""
        self._closed = True
        if self._release is not None:
            self._release.cancel()
            self._release = None
