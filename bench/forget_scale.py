"""Benchmark: forgetting one long chat, and a record sent to the same client meanwhile.

For each size, one `record_chat` of N messages (one conversation, one session), then
`ClientSessions.erase` of all its exchanges (what `memory.forget --session` asks of the
store), while another conversation of the same client records one exchange: its latency
is how long a caller waits while forget runs (since issue 24 item 3: it is refused with
`busy` at once, and its time is that of the refusal). The library alone, no socket, no index
(the index rebuild after a forget is the pipeline's, measured by bench/scale.py).

Baseline from the same run: the time the same chat took to record.

Run: .venv/bin/python bench/forget_scale.py [--sizes 5000,10000,20000,150000]
Prints figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from memd.errors import Busy
from memd.layout import ClientLayout
from memd.markdown import exchange_spans
from memd.sessions.tracker import ClientSessions

PAYLOAD = "word " * 20  # ~100 characters per message


def history(n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n // 2):
        out += [
            {"role": "user", "content": f"{PAYLOAD} question {i}"},
            {"role": "assistant", "content": f"{PAYLOAD} answer {i}"},
        ]
    return out


async def one(root: Path, n: int) -> None:
    layout = ClientLayout(root, f"c{n}")
    async with ClientSessions(layout) as cs:
        chat = history(n)
        t = time.perf_counter()
        rec = await cs.record_chat(chat[:-1], chat[-1])
        recorded = time.perf_counter() - t
        sid = rec["session_id"]
        text = layout.session_file(sid).read_text(encoding="utf-8")
        keys = {s.key for s in exchange_spans(text)}
        probe: list[tuple[float, str]] = []

        async def record_meanwhile() -> None:
            await asyncio.sleep(0.05)  # the erase has begun
            t0 = time.perf_counter()
            try:
                await cs.record_exchange("other", "a record sent while forget runs", "ok")
                outcome = "answered"
            except Busy:
                outcome = "refused (busy)"
            probe.append((time.perf_counter() - t0, outcome))

        t = time.perf_counter()
        meanwhile = asyncio.create_task(record_meanwhile())
        erased = await cs.erase({sid: keys})
        took = time.perf_counter() - t
        await meanwhile
        print(
            f"{n:>7} messages ({len(keys):>6} exchanges): record_chat {recorded:6.2f} s | "
            f"erase {took:6.2f} s ({erased.exchanges} cut) | "
            f"a record sent meanwhile {probe[0][1]} in {probe[0][0]:6.2f} s"
        )


async def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, dir {tmp}")
        for n in sizes:
            await one(Path(tmp), n)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="5000,10000,20000")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")]))
