"""memd's inotify watch (memd.indexing.daemon.dir_events): the changes of files in the
watched folders and in subfolders made after the start, the end when a watched folder
goes away, and no wake-up of the process while nothing changes (watchfiles' thread woke
every second)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from memd.indexing.daemon.dir_events import DirEvents, available

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not available(), reason="inotify"
)


def test_changes_in_a_folder_and_a_new_subfolder_are_reported(tmp_path: Path) -> None:
    async def scenario() -> set[Path]:
        events = DirEvents([tmp_path])
        seen: set[Path] = set()

        async def consume() -> None:
            async for batch in events.changes():
                seen.update(batch)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        (tmp_path / "a.md").write_text("one")
        (tmp_path / "sub").mkdir()
        while tmp_path / "sub" not in seen:  # its watch is added once it is seen
            await asyncio.sleep(0.01)
        (tmp_path / "sub" / "b.md").write_text("two")
        while tmp_path / "sub" / "b.md" not in seen:
            await asyncio.sleep(0.01)
        events.close()
        await asyncio.wait_for(task, 30)
        return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert {tmp_path / "a.md", tmp_path / "sub", tmp_path / "sub" / "b.md"} <= seen


def test_the_watch_ends_when_its_folder_goes_away(tmp_path: Path) -> None:
    folder = tmp_path / "sessions"
    folder.mkdir()

    async def scenario() -> None:
        events = DirEvents([folder])

        async def consume() -> None:
            async for _ in events.changes():
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        os.rmdir(folder)
        await asyncio.wait_for(task, 30)

    asyncio.run(scenario())


def test_an_idle_watch_has_no_thread(tmp_path: Path) -> None:
    async def scenario() -> int:
        before = len(os.listdir("/proc/self/task"))
        events = DirEvents([tmp_path])
        task = asyncio.create_task(_drain(events))
        await asyncio.sleep(0.1)
        during = len(os.listdir("/proc/self/task"))
        events.close()
        await asyncio.wait_for(task, 30)
        return during - before

    assert asyncio.run(scenario()) == 0


async def _drain(events: DirEvents) -> None:
    async for _ in events.changes():
        pass
