"""A big record_chat decides off the event loop, and in order with the client's other records.

The decision's CPU-heavy part (matching a long history, rendering its messages) runs in
the client's worker thread under its decision lock (memd.sessions.tracker). The test
holds that thread on a gate once the big call is deciding, so what it asserts does not
depend on timing: meanwhile another client records, the busy client's sessions are
listed, and the busy client's next record waits its turn and is numbered after it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from memd.markdown import transcript
from memd.sessions.tracker import OFFLOAD_MESSAGES
from tests.support.sessions import Clock, open_sessions, run


def _history(n: int) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"message {i} about the pier"} for i in range(n)]


def test_other_work_is_served_while_a_big_record_chat_decides(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        async with (
            open_sessions(tmp_path, clock, "busy") as busy,
            open_sessions(tmp_path, clock, "calm") as calm,
        ):
            big_request = _history(4 * OFFLOAD_MESSAGES + 1)
            big = asyncio.create_task(
                busy.record_chat(big_request, {"role": "assistant", "content": "done"})
            )
            while not busy._core.deciding.locked():  # the big call is deciding
                await asyncio.sleep(0)
            gate = threading.Event()
            assert busy._core.hashing is not None
            busy._core.hashing.submit(gate.wait)  # its next step in the worker waits for the gate
            try:
                later = asyncio.create_task(
                    busy.record_chat(
                        [{"role": "user", "content": "a new chat"}],
                        {"role": "assistant", "content": "hello"},
                    )
                )
                other = await calm.record_exchange("c1", "Where is the key?", "Under the pot.")
                listed = await busy.list_sessions()
                assert not big.done() and not later.done()
                assert other["conversation"] == 1
                assert len(listed) <= 1
                for _ in range(50):
                    await asyncio.sleep(0)
                assert not later.done(), "a later record of the busy client overtook it"
            finally:
                gate.set()
            first, second = await big, await later
        assert first["appended"] == len(big_request) + 1
        assert (first["conversation"], second["conversation"]) == (1, 2)
        assert first["session_id"] == second["session_id"]
        parsed = transcript.read_transcript(Path(first["path"]))
        assert [c.number for c in parsed.conversations] == [1, 2]
        assert len(parsed.conversations[0].exchanges) == (len(big_request) + 1) // 2

    run(main)
