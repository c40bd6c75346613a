"""The state database's connections reuse their cursors (issue 29).

`sqlite3.Connection.execute` makes a cursor per call, and Python 3.11's sqlite3 keeps a
weak reference to every cursor a connection made, pruning the dead ones only every 200
cursors. Recording made ~8 a commit: under bench/load.py the dead references were the most
common object left in the memory a load had grown (docs/performance.md, "memd after load,
round 6"). Recording now leaves none behind.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from tests.support.sessions import Clock, open_sessions, run


def dead_weakrefs() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is weakref.ref and o() is None)


def test_recording_leaves_no_dead_cursor_references_behind(tmp_path: Path) -> None:
    clock = Clock()
    counts: list[int] = []

    async def scenario() -> None:
        async with open_sessions(tmp_path, clock) as cs:
            messages = [{"role": "user", "content": "first question about the garden"}]
            reply = {"role": "assistant", "content": "an answer"}
            await cs.record_chat(messages, reply)
            counts.append(dead_weakrefs())
            for i in range(240):
                messages = [*messages, reply, {"role": "user", "content": f"question {i}"}]
                reply = {"role": "assistant", "content": f"answer {i}"}
                out = await cs.record_chat(messages, reply)
                assert out["match"] == "continuation"
                clock.advance(0.1)
                if i % 10 == 9:
                    counts.append(dead_weakrefs())

    run(scenario)
    # 240 commits made ~1,900 cursors before: up to 199 dead references at a time
    assert max(counts) - counts[0] < 20, counts
