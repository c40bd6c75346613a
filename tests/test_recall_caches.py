"""Recall's memos are let go once no client has recalled for a while.

After five minutes of bench/load.py at 20 clients memd stayed at 60-64 MB PSS, 34 idle
before it: recall's memos (each candidate's terms, the dates it says, its parsed
heading) stayed full for good (issue 29). They are dropped when every client's lane has
been idle for the spell, never while a recall of any client runs, and a recall after the
release computes the same again. The transcripts' newline offsets are kept: reading a
long transcript through again cost a recall 31 ms.
"""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from memd.indexing.query import memo, ranking
from memd.indexing.query.dates import said_dates
from memd.markdown import parse_exchange_heading
from memd.recall.caches import RecallCaches
from memd.recall.lane import RecallLane

IDLE = 0.3
HEADING = "2023-05-08 13:56:00 UTC · exchange 2 — planning the trip"
TEXT = "## " + HEADING + "\n\n**user:** Yesterday I found the spare key under the mat."


def _recall_like(caches: RecallCaches, transcript: Path) -> float:
    """What a recall computes and keeps, through the same functions and caches."""
    fd = os.open(transcript, os.O_RDONLY)
    try:
        lines = list(caches.recent.lines(transcript, fd))
    finally:
        os.close(fd)
    assert lines[0] == "# a transcript"
    parse_exchange_heading(HEADING)
    said = said_dates(TEXT, datetime(2023, 5, 8, tzinfo=UTC))
    assert [s.absolute() for s in said] == ["yesterday = 7 May 2023"]
    return ranking.coverage(["spare", "key"], TEXT, HEADING)


def _kept(caches: RecallCaches, transcript: Path) -> dict[str, int]:
    return {
        "memo entries": sum(len(m) for m in memo._MEMOS),
        "headings": parse_exchange_heading.cache_info().currsize,
        "offsets": 1 if caches.recent.kept(transcript) is not None else 0,
    }


def _transcript(tmp_path: Path) -> Path:
    path = tmp_path / "session.md"
    path.write_text("# a transcript\n\n" + TEXT + "\n", encoding="utf-8")
    return path


def test_an_idle_daemon_lets_go_of_recalls_memos_and_keeps_the_offsets(tmp_path: Path) -> None:
    transcript = _transcript(tmp_path)

    async def scenario() -> tuple[dict[str, int], dict[str, int], float, float]:
        caches = RecallCaches(idle_seconds=IDLE)
        lane = RecallLane(caches, idle_seconds=IDLE)
        first = await lane.submit(lambda: _recall_like(caches, transcript), waiting=4)
        full = _kept(caches, transcript)
        await asyncio.sleep(IDLE * 3)
        emptied = _kept(caches, transcript)
        again = await lane.submit(lambda: _recall_like(caches, transcript), waiting=4)
        lane.close()
        caches.close()
        return full, emptied, first, again

    full, emptied, first, again = asyncio.run(scenario())
    assert full["memo entries"] >= 2 and full["headings"] >= 1 and full["offsets"] == 1
    assert emptied == {"memo entries": 0, "headings": 0, "offsets": 1}
    assert first == again == 1.0  # the next recall computes the same from scratch


def test_nothing_is_let_go_while_any_clients_recall_runs(tmp_path: Path) -> None:
    """Client b's recall ended long ago; a's is still running (a slow index): b's idle
    spell is the daemon's only once a's recall has ended too."""
    transcript = _transcript(tmp_path)
    release_a = threading.Event()

    def slow_recall() -> float:
        value = _recall_like(caches, transcript)
        release_a.wait(10.0)
        return value

    caches = RecallCaches(idle_seconds=IDLE)

    async def scenario() -> tuple[int, int, int]:
        a, b = RecallLane(caches, idle_seconds=IDLE), RecallLane(caches, idle_seconds=IDLE)
        running = a.submit(slow_recall, waiting=4)
        await b.submit(lambda: _recall_like(caches, transcript), waiting=4)
        await asyncio.sleep(IDLE * 3)
        while_running = caches.releases
        release_a.set()
        await running
        right_after = caches.releases
        await asyncio.sleep(IDLE * 3)
        a.close()
        b.close()
        caches.close()
        return while_running, right_after, caches.releases

    while_running, right_after, after_idle = asyncio.run(scenario())
    assert (while_running, right_after, after_idle) == (0, 0, 1)
    assert _kept(caches, transcript) == {"memo entries": 0, "headings": 0, "offsets": 1}


def test_recalls_closer_than_the_spell_keep_everything(tmp_path: Path) -> None:
    transcript = _transcript(tmp_path)

    async def scenario() -> tuple[int, dict[str, int]]:
        caches = RecallCaches(idle_seconds=IDLE)
        lane = RecallLane(caches, idle_seconds=IDLE)
        for _ in range(6):  # 6 x IDLE/2: three spells' worth of time, never one idle
            await lane.submit(lambda: _recall_like(caches, transcript), waiting=4)
            await asyncio.sleep(IDLE / 2)
        kept = _kept(caches, transcript)
        lane.close()
        caches.close()
        return caches.releases, kept

    releases, kept = asyncio.run(scenario())
    assert releases == 0
    assert kept["memo entries"] >= 2 and kept["headings"] >= 1 and kept["offsets"] == 1
