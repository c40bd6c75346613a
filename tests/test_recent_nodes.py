"""Nodes and exchange keys a record call adds stay in memory until they are on disk.

memd keeps only the prefix nodes and exchange keys used last (`index_capacity`) and asks
the state database for the others. A node or key evicted before its commit would be in
neither place: a second call deciding meanwhile would not find it. These tests hold the
client's commit thread so that the second call decides while the first is not on disk.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from memd.sessions.recent import Recent
from memd.sessions.tracker import ClientSessions
from tests.support.sessions import Clock, open_sessions, run


def u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def hold_commits(cs: ClientSessions) -> threading.Event:
    """Block the client's one commit thread until the returned event is set."""
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(30)

    executor = cs._core.committer._executor
    assert executor is not None
    executor.submit(hold)
    assert holding.wait(10), "the commit thread never took the gate"
    return gate


async def queued(cs: ClientSessions, n: int) -> None:
    """Wait until `n` decided changes wait for the held commit thread."""
    for _ in range(1000):
        if cs._core.committer.unsaved >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} changes were never queued")


def test_an_edit_decided_before_the_first_call_commits_finds_its_branch(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_sessions(tmp_path, Clock(), index_capacity=1) as cs:
            gate = hold_commits(cs)
            long_chat = [u("q1"), a("a1"), u("q2"), a("a2"), u("q3")]
            first = asyncio.ensure_future(cs.record_chat(long_chat, a("a3")))
            await queued(cs, 1)  # decided; its commit waits for the gate
            edit = asyncio.ensure_future(
                cs.record_chat([u("q1"), a("a1"), u("q2, edited")], a("a2'"))
            )
            await queued(cs, 2)
            gate.set()
            results = await asyncio.gather(first, edit)
        assert results[0]["match"] == "new"
        assert (results[1]["match"], results[1]["conversation"]) == ("edited", 1)

    run(scenario)


def test_a_retried_exchange_decided_before_the_first_commits_is_a_duplicate(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with open_sessions(tmp_path, Clock(), index_capacity=1) as cs:
            gate = hold_commits(cs)
            calls = [
                asyncio.ensure_future(
                    cs.record_exchange("conv", f"q{i}", f"a{i}", exchange_id=f"e{i}")
                )
                for i in range(3)
            ]
            await queued(cs, 3)
            retry = asyncio.ensure_future(cs.record_exchange("conv", "q0", "a0", exchange_id="e0"))
            await queued(cs, 4)
            gate.set()
            results = await asyncio.gather(*calls, retry)
        assert [r["duplicate"] for r in results] == [False, False, False, True]

    run(scenario)


def test_recent_evicts_only_saved_entries_used_longest_ago() -> None:
    recent: Recent[str, int] = Recent(2)
    for key in "abc":
        recent.add(key, ord(key))
    assert len(recent) == 3  # none on disk yet: none may go
    recent.saved(["a", "b"])
    assert sorted(k for k in "abc" if k in recent) == ["a", "b", "c"]
    assert recent.get("a") == ord("a")  # a is now the one used last
    recent.saved(["c"])
    assert [k for k in "abc" if recent.get(k) is not None] == ["a", "c"]
    recent.keep("d", 4)  # read back from disk
    assert len(recent) == 2 and recent.get("d") == 4


def test_recent_keeps_an_entry_until_every_write_of_it_is_saved() -> None:
    recent: Recent[str, int] = Recent(1)
    recent.add("node", 1)
    recent.add("node", 2)  # a second call writes it again before the first commits
    recent.keep("node", 1)  # a read of the store does not replace what is on its way
    recent.saved(["node"])
    for key in "xy":
        recent.keep(key, 0)
    assert recent.get("node") == 2
    recent.saved(["node"])
    recent.keep("z", 0)
    assert recent.get("node") is None


def test_recent_without_capacity_keeps_everything() -> None:
    recent: Recent[int, int] = Recent(None)
    for i in range(1000):
        recent.add(i, i)
    recent.saved(range(1000))
    assert len(recent) == 1000
