"""A client at rest gives its sqlite page caches back (issue 29).

Each client's state database has two connections (the IO thread's writer and the event
loop's reader), each with a page cache of up to `CACHE_KIB`. A burst of records fills
both, and they stayed full for good: up to 10 MB of memd at 20 clients. Once no commit
has come for `SHRINK_AFTER` seconds, both are given back (`PRAGMA shrink_memory`); the
next record reads what it needs again.
"""

from __future__ import annotations

import _sqlite3
import asyncio
import ctypes
from collections.abc import Callable
from pathlib import Path

import pytest

from memd.sessions import committer
from tests.support.faults import wait_for
from tests.support.sessions import Clock, open_sessions, run

_used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used  # the process's, every connection
_used.restype = ctypes.c_int64


def sqlite_bytes() -> int:
    return int(_used())


def test_a_client_at_rest_gives_its_page_caches_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "SHRINK_AFTER", 0.5)
    clock = Clock()
    seen: dict[str, int] = {}

    async def scenario() -> None:
        async with open_sessions(tmp_path, clock) as cs:
            seen["start"] = sqlite_bytes()
            for chat in range(80):  # 80 chats of 10 turns: ~800 nodes, 80 conversation rows
                messages = [{"role": "user", "content": f"chat {chat} opens on the garden"}]
                for turn in range(10):
                    reply = {"role": "assistant", "content": f"answer {chat}.{turn} " * 20}
                    await cs.record_chat(messages, reply)
                    messages = [*messages, reply, {"role": "user", "content": f"q {turn}"}]
                    clock.advance(0.1)
            seen["busy"] = sqlite_bytes()
            grown = seen["busy"] - seen["start"]
            assert grown > 60_000, seen  # the caches filled (~100 KB)
            await rested(lambda: sqlite_bytes() < seen["start"] + grown // 4)
            seen["rested"] = sqlite_bytes()
            # The next record finds its chat again through the shrunk reader and writer.
            reply = {"role": "assistant", "content": "after the rest"}
            out = await cs.record_chat(messages, reply)
            assert out["match"] == "continuation"

    run(scenario)


async def rested(condition: Callable[[], bool]) -> None:
    """Poll off the event loop, which must stay free for the committer's idle timer."""
    await asyncio.to_thread(wait_for, condition, 20.0, 0.05, "the page caches given back")
