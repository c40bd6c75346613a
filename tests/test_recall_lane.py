"""A client's recall lane: its threads end after an idle spell and come back when needed.

Every thread that ran a recall holds glibc's per-thread cache of freed blocks and its
stack's pages while it lives (issue 29), so an idle lane keeps none; a recall after the
spell runs on new threads, and recalls that keep coming keep the same ones.
"""

from __future__ import annotations

import asyncio
import threading

from memd.recall.lane import RecallLane
from tests.support.faults import wait_for

IDLE = 0.2


def lane_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("memd-recall")}


def test_an_idle_lanes_threads_end_and_the_next_recall_gets_new_ones() -> None:
    before = lane_threads()

    async def scenario() -> tuple[threading.Thread, threading.Thread]:
        lane = RecallLane(idle_seconds=IDLE)
        first = await lane.submit(threading.current_thread, waiting=4)
        await asyncio.sleep(IDLE * 3)
        await asyncio.to_thread(
            wait_for, lambda: not first.is_alive(), 10.0, 0.02, "the idle lane's thread ended"
        )
        second = await lane.submit(threading.current_thread, waiting=4)
        lane.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert second is not first and second.name.startswith("memd-recall")
    wait_for(lambda: lane_threads() <= before, 10.0, 0.02, "the lanes' threads ended")


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
