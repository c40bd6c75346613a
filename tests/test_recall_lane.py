"""A client's recall lane: its threads end after an idle spell and come back when needed.

Every thread that ran a recall holds glibc's per-thread cache of freed blocks and its
stack's pages while it lives (issue 29), so an idle lane keeps none; a recall after the
spell runs on new threads, and recalls that keep coming keep the same ones.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from memd.recall.lane import RecallLane

IDLE = 0.2


def lane_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("memd-recall")}


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_an_idle_lanes_threads_end_and_the_next_recall_gets_new_ones() -> None:
    before = lane_threads()

    async def scenario() -> tuple[threading.Thread, threading.Thread, bool]:
        lane = RecallLane(idle_seconds=IDLE)
        first = await lane.submit(threading.current_thread, waiting=4)
        await asyncio.sleep(IDLE * 3)
        ended = await asyncio.to_thread(wait_until, lambda: not first.is_alive())
        second = await lane.submit(threading.current_thread, waiting=4)
        lane.close()
        return first, second, ended

    first, second, ended = asyncio.run(scenario())
    assert ended, "the idle lane's thread did not end"
    assert second is not first and second.name.startswith("memd-recall")
    assert wait_until(lambda: lane_threads() <= before)


def test_a_lane_in_steady_use_keeps_its_threads() -> None:
    """Recalls closer together than the idle spell run on the same thread: each one puts
    the spell off, so a busy client's threads are not churned."""

    async def scenario() -> set[threading.Thread]:
        lane = RecallLane(idle_seconds=IDLE)
        seen: set[threading.Thread] = set()
        for _ in range(6):  # 6 x IDLE/2: three idle spells' worth of time
            seen.add(await lane.submit(threading.current_thread, waiting=4))
            await asyncio.sleep(IDLE / 2)
        lane.close()
        return seen

    assert len(asyncio.run(scenario())) == 1
