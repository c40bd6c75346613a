"""kill -9 in the middle of 1,000 concurrent records: acknowledged means recorded, exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from memd.layout import ClientLayout
from memd.markdown import transcript

RECORDER = textwrap.dedent("""
    import asyncio, json, sys, time
    from pathlib import Path
    import structlog
    from memd.layout import ClientLayout
    from memd.sessions.tracker import ClientSessions

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    def u(t): return {"role": "user", "content": t}
    def a(t): return {"role": "assistant", "content": t}

    async def main(root, mode, round_):
        cs = ClientSessions(ClientLayout(Path(root), "crash"), inactivity_minutes=60,
                            max_minutes=600)
        await cs.open()
        out = sys.stdout
        if mode == "fire":
            r = await cs.record_chat([u("chat opening")], a("chat reply"))
            out.write(f"chat {r['session_id']} {r['conversation']}\\n")
            out.flush()

            async def one(i):
                r = await cs.record_exchange(f"conv-{i % 4}", f"user {round_}-{i}",
                                             f"assistant {round_}-{i}\\n" + "x" * (i % 300))
                out.write(f"ack {round_}-{i} {r['session_id']} {r['conversation']}\\n")
                out.flush()

            await asyncio.gather(*(one(i) for i in range(1000)))
            out.write("all acknowledged\\n")
            out.flush()
            await asyncio.sleep(3600)  # wait for the kill
        else:
            idle = await cs.expire(time.time() + 59 * 60)  # persisted activity is recent
            r = await cs.record_exchange("conv-0", f"after restart {round_}", "ok")
            history = [u("chat opening"), a("chat reply")]
            for done in range(int(round_)):
                history += [u(f"again {done}"), a(f"sure {done}")]
            c = await cs.record_chat([*history, u(f"again {round_}")], a(f"sure {round_}"))
            print(json.dumps({"idle": idle, "exchange": r, "chat": c}))
            await cs.close()

    asyncio.run(main(*sys.argv[1:]))
""")


def _fire_and_kill(script: Path, root: Path, round_: int, kill_after: float) -> list[str]:
    """Start the recorder, SIGKILL it; return every line it printed.

    An int `kill_after` kills after that many acks (mid-burst for sure); a float kills
    that many seconds after the first line, which sometimes lands between a transcript
    fsync and its state commit, the case recovery must cut back.
    """
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root), "fire", str(round_)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        if isinstance(kill_after, float):
            lines.append(proc.stdout.readline().rstrip("\n"))
            time.sleep(kill_after)
        while sum(x.startswith("ack ") for x in lines) < kill_after:
            line = proc.stdout.readline()
            assert line, f"recorder exited early: {lines[-3:]}"
            lines.append(line.rstrip("\n"))
            assert time.monotonic() < deadline
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    return lines + rest.splitlines()


@pytest.mark.faults
def test_kill_mid_burst_keeps_every_acknowledged_exchange_once(tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    root = tmp_path / "mem"
    layout = ClientLayout(root, "crash")
    acked: list[str] = []
    sessions: set[str] = set()
    numbers: dict[str, int] = {}
    kills: list[float] = [250, 600, 50, *(random.uniform(0.0, 0.08) for _ in range(4))]
    for round_, kill_after in enumerate(kills):
        lines = _fire_and_kill(script, root, round_, kill_after)
        for line in lines:
            kind, *rest = line.split() or [""]
            if kind == "ack":
                label, sid, conv = rest
                acked.append(label)
                sessions.add(sid)
                # every round continues the same session and the same conversations
                conv_id = f"conv-{int(label.split('-')[1]) % 4}"
                assert numbers.setdefault(conv_id, int(conv)) == int(conv)
            elif kind == "chat":
                sessions.add(rest[0])
        assert len(sessions) == 1, "a restart must continue the same session file"
        sid = next(iter(sessions))
        proc = subprocess.run(
            [sys.executable, str(script), str(root), "continue", str(round_)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["idle"] == []
        assert result["exchange"]["session_id"] == sid
        assert result["exchange"]["conversation"] == numbers["conv-0"]
        assert (
            result["chat"]["session_id"],
            result["chat"]["new_conversation"],
            result["chat"]["match"],
        ) == (sid, False, "continuation")

        parsed = transcript.read_transcript(layout.session_file(sid))
        users = Counter(
            p.text
            for c in parsed.conversations
            for e in c.exchanges
            for p in e.parts
            if p.label == "User"
        )
        missing = [x for x in acked if users[f"user {x}"] != 1]
        assert missing == [], f"acknowledged but not recorded exactly once: {missing[:5]}"
        assert max(users.values()) == 1
        for c in parsed.conversations:  # no torn exchange: every one has both halves
            for e in c.exchanges:
                assert [p.label for p in e.parts] == ["User", "Assistant"]
                if e.parts[0].text.startswith("user "):
                    who = e.parts[0].text.removeprefix("user ")
                    assert e.parts[1].text.startswith(f"assistant {who}\n")
        exchange_numbers: dict[int, list[int]] = {}
        for c in parsed.conversations:
            exchange_numbers.setdefault(c.number, []).extend(e.number for e in c.exchanges)
        for nums in exchange_numbers.values():
            assert nums == list(range(1, len(nums) + 1))
