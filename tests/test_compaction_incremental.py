"""Compaction that pays once: incremental re-compaction, token accounting, the daily cap.

Against the fake LLM of tests/support/fake_llm.py (a real HTTP server on 127.0.0.1 that
echoes every `FACT-…` token it was shown and reports `usage` as ceil(chars / 4)), so a
summary says which text it was made from and every prompt can be inspected.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memd.compaction import CompactionStates, Compactor, Store, base_file, summary_meta
from memd.layout import ClientLayout
from memd.markdown import transcript
from tests.support import compaction as support
from tests.support.compaction import T0, Clock, aio, config, exchange, started

S = CompactionStates
REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ("tests.support.compaction_fixtures",)
write_session = functools.partial(support.write_session, question="Old question")


def append(
    layout: ClientLayout, sid: str, first: int, count: int, word: str = "new", filler: int = 0
) -> bytes:
    """The conversation goes on in the restored transcript (memd appends, never rewrites)."""
    with layout.session_file(sid).open("a") as fh:
        for n in range(first, first + count):
            text = f"Later question {n}: remember FACT-{word}{n}. " + "blah " * filler
            fh.write(exchange(n, text.strip()))
    return layout.session_file(sid).read_bytes()


async def compact(comp: Compactor, sid: str, client: str = "laptop") -> None:
    await comp.submit(client, sid)
    await comp.drain()


def base_body(layout: ClientLayout, sid: str) -> str:
    """The first line the fake LLM wrote into the summary (it names the prompt's digest)."""
    text = layout.summary_file(sid).read_text()
    return next(line for line in text.split("\n") if line.startswith("Summary "))


# --- incremental re-compaction -----------------------------------------------------------


@aio
async def test_resumed_session_summarises_only_new_exchanges_with_the_base(fake, layout):
    sid = "2026-11-30T02-41-07Z-0101"
    raw = write_session(layout, sid, 3)
    comp = await started(Compactor(config(fake), clock=Clock(T0 + 3600)), layout)
    try:
        await compact(comp, sid)
        first = base_body(layout, sid)
        assert await comp.restore("laptop", sid) == "restored"
        assert layout.session_file(sid).read_bytes() == raw  # back in place, searchable
        assert not layout.summary_file(sid).exists()  # not indexed twice
        assert base_file(layout, sid).exists()  # but kept as the base
        full = append(layout, sid, 4, 2)
        asked = len(fake.requests)
        await compact(comp, sid)
    finally:
        await comp.close()
    [prompt] = fake.prompts()[asked:]
    assert first in prompt  # the base summary is the context
    assert "FACT-new4" in prompt and "FACT-new5" in prompt
    assert "Old question" not in prompt  # exchanges already summarised are not sent again
    text = layout.summary_file(sid).read_text()
    assert first not in text  # replaced, not appended to
    for fact in ("FACT-1", "FACT-2", "FACT-3", "FACT-new4", "FACT-new5"):
        assert fact in text
    meta = summary_meta(layout, sid)
    assert meta["started"] == "2026-11-30T02:42:07Z" and meta["ended"] == "2026-11-30T02:46:07Z"
    assert meta["source_sha256"] == hashlib.sha256(full).hexdigest()
    assert layout.archive_file(sid).read_bytes() == full  # every exchange, byte for byte
    assert not base_file(layout, sid).exists()
    assert not layout.session_file(sid).exists()


@aio
async def test_many_new_exchanges_stay_bounded_and_keep_every_fact(fake, layout):
    sid = "2026-11-30T02-41-07Z-0102"
    write_session(layout, sid, 3)
    bound = 3_000
    comp = await started(Compactor(config(fake), max_request_chars=bound), layout)
    try:
        await compact(comp, sid)
        await comp.restore("laptop", sid)
        full = append(layout, sid, 4, 40)
        asked = len(fake.requests)
        await compact(comp, sid)
    finally:
        await comp.close()
    prompts = fake.prompts()[asked:]
    assert len(prompts) > 2 and max(len(p) for p in prompts) <= bound
    assert not any("Old question" in p for p in prompts)
    text = layout.summary_file(sid).read_text()
    assert all(f"FACT-{n}\n" in text for n in (1, 2, 3))
    assert all(f"FACT-new{n}\n" in text for n in range(4, 44))
    assert layout.archive_file(sid).read_bytes() == full


@aio
async def test_cost_over_many_cycles_stays_within_the_budget(fake, layout):
    """Issue #17's target: input <= 1.5 x recorded + one base summary per cycle."""
    sid = "2026-11-30T02-41-07Z-0103"
    write_session(layout, sid, 3)
    comp = await started(Compactor(config(fake)), layout)
    bases = 0
    try:
        await compact(comp, sid)
        for cycle in range(10):
            bases += len(layout.summary_file(sid).read_text())
            await comp.restore("laptop", sid)
            # Exchanges of a working chat (~800 chars), so the prompt's own text is small.
            full = append(layout, sid, 4 + 3 * cycle, 3, word=f"c{cycle}x", filler=150)
            await compact(comp, sid)
    finally:
        await comp.close()
    spent = sum(len(p) for p in fake.prompts())
    assert spent <= 1.5 * len(full.decode()) + bases
    text = layout.summary_file(sid).read_text()
    assert all(f"FACT-c{c}x{4 + 3 * c}" in text for c in range(10))


@aio
async def test_a_settings_change_makes_the_next_compaction_full(fake, layout):
    sid = "2026-11-30T02-41-07Z-0104"
    write_session(layout, sid, 3)
    comp = await started(Compactor(config(fake, llm_model="m1")), layout)
    try:
        await compact(comp, sid)
        first = base_body(layout, sid)
        await comp.restore("laptop", sid)
        full = append(layout, sid, 4, 1)
        comp.set_config(config(fake, llm_model="m2"))
        asked = len(fake.requests)
        await compact(comp, sid)
    finally:
        await comp.close()
    [prompt] = fake.prompts()[asked:]
    assert "Old question 1" in prompt and "FACT-new4" in prompt and first not in prompt
    assert summary_meta(layout, sid)["llm_model"] == "m2"
    assert layout.archive_file(sid).read_bytes() == full


@aio
async def test_recompact_all_after_a_settings_change_reads_the_full_archive(fake, layout):
    sid = "2026-11-30T02-41-07Z-0105"
    write_session(layout, sid, 3)
    comp = await started(Compactor(config(fake, llm_model="m1")), layout)
    try:
        await compact(comp, sid)
        await comp.restore("laptop", sid)
        full = append(layout, sid, 4, 2)
        await compact(comp, sid)  # incremental
        incremental = base_body(layout, sid)
        comp.set_config(config(fake, llm_model="m2"))
        asked = len(fake.requests)
        [result] = await comp.recompact("laptop")
    finally:
        await comp.close()
    assert result["result"] == "recompacted"
    [prompt] = fake.prompts()[asked:]
    assert "Old question 1" in prompt and "FACT-new5" in prompt  # the whole archive
    assert incremental not in prompt  # no summary as a shortcut
    assert summary_meta(layout, sid)["llm_model"] == "m2"
    assert layout.archive_file(sid).read_bytes() == full


# --- token accounting ----------------------------------------------------------------------


@pytest.mark.parametrize("reported", [True, False])
@aio
async def test_tokens_are_counted_per_session_and_client_and_survive_restarts(
    fake, layout, reported
):
    fake.report_usage = reported
    sid = "2026-11-30T02-41-07Z-0106"
    write_session(layout, sid, 3)
    clock = Clock(T0 + 3600)
    comp = await started(Compactor(config(fake), clock=clock), layout)
    try:
        await compact(comp, sid)
        await comp.restore("laptop", sid)  # a resumed session keeps what it spent
        append(layout, sid, 4, 1)
        await compact(comp, sid)
    finally:
        await comp.close()
    expected = {
        "input_tokens": sum(math.ceil(len(p) / 4) for p in fake.prompts()),
        "requests": len(fake.requests),
        "estimated_requests": 0 if reported else len(fake.requests),
    }
    comp = await started(Compactor(config(fake), clock=clock), layout)
    try:
        tokens = comp.sessions("laptop")[sid]["tokens"]
        client = comp.client_status("laptop")["tokens"]
        everything = comp.status()["tokens"]
    finally:
        await comp.close()
    for totals in (tokens, client, everything):
        for period in ("today", "total"):
            got = totals[period]
            assert {k: got[k] for k in expected} == expected, (period, got)
            assert got["output_tokens"] > 0


# --- the daily cap ---------------------------------------------------------------------------


@aio
async def test_the_cap_defers_compactions_until_the_next_day(fake, layout):
    clock = Clock(datetime(2026, 12, 1, 22, 0, tzinfo=UTC).timestamp())
    sids = [f"2026-11-30T02-41-07Z-02{n:02x}" for n in range(3)]
    raws = [write_session(layout, sid, 2) for sid in sids]
    comp = await started(Compactor(config(fake, max_input_tokens_per_day=1), clock=clock), layout)
    midnight = datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    try:
        for sid in sids:
            await comp.submit("laptop", sid)
        await comp.drain()
        # One compaction starts below the cap; the rest wait for the next day.
        states = {sid: comp.sessions("laptop")[sid]["state"] for sid in sids}
        assert sorted(states.values()) == [S.COMPACTED, S.DEFERRED, S.DEFERRED]
        status = comp.client_status("laptop")
        assert status["deferred"] == 2
        assert comp.status()["cap"]["reached"] is True
        deferred = [sid for sid in sids if states[sid] == S.DEFERRED]
        for sid in deferred:
            info = comp.sessions("laptop")[sid]
            assert info["next_retry"] == transcript.iso(midnight)
            assert layout.session_file(sid).exists()  # untouched, still searchable
        asked = len(fake.requests)
        assert comp.client_status("laptop")["cap"]["reached"] is True
        results = await comp.recompact("laptop")  # an explicit request waits for the day too
        assert [r["result"] for r in results] == ["deferred"]
        assert comp.step(midnight - 1) == 0 and len(fake.requests) == asked
        clock.now = midnight + 5  # the test clock passes midnight
        comp.step()
        await comp.drain()
        clock.now = midnight + 86_400 + 5
        comp.step()
        await comp.drain()
    finally:
        await comp.close()
    for sid, raw in zip(sids, raws, strict=True):
        assert Store(layout).load()[sid].state == S.COMPACTED
        assert layout.archive_file(sid).read_bytes() == raw  # nothing lost
        assert layout.summary_file(sid).exists()


@aio
async def test_the_cap_counts_per_client_and_for_all_clients(fake, tmp_path):
    a, b = (ClientLayout(tmp_path / "memory", name) for name in ("a", "b"))
    for lay in (a, b):
        lay.ensure()
    sid = "2026-11-30T02-41-07Z-0301"
    write_session(a, sid, 2)
    write_session(a, sid + "0", 2)
    write_session(b, sid, 2)
    comp = await started(Compactor(config(fake, max_input_tokens_per_day_per_client=1)), a, b)
    try:
        for client, s in (("a", sid), ("a", sid + "0"), ("b", sid)):
            await compact(comp, s, client)
        assert comp.sessions("a")[sid + "0"]["state"] == S.DEFERRED  # a's own cap
        assert comp.sessions("b")[sid]["state"] == S.COMPACTED  # b is not held by a
    finally:
        await comp.close()
    write_session(b, sid + "1", 2)
    comp = await started(Compactor(config(fake, max_input_tokens_per_day=1)), a, b)
    try:
        await compact(comp, sid + "1", "b")
        assert comp.sessions("b")[sid + "1"]["state"] == S.DEFERRED  # all clients' cap
    finally:
        await comp.close()


def test_cap_settings_are_validated():
    from memd.config import ConfigError, parse_config

    assert parse_config({}).compaction.max_input_tokens_per_day > 0  # a bound by default
    with pytest.raises(ConfigError, match="max_input_tokens_per_day"):
        parse_config({"compaction": {"max_input_tokens_per_day": -1}})


# --- kill -9 during an incremental compaction ---------------------------------------------

CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from pathlib import Path
    from memd.compaction import Compactor
    from memd.config import CompactionConfig
    from memd.layout import ClientLayout

    root, sid, base_url, kill_at = sys.argv[1:5]

    def hook(step, session_id):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        layout = ClientLayout(Path(root), "laptop")
        cfg = CompactionConfig(enabled=True, llm_model="fake-model", base_url=base_url,
                               api_key="sk-test")
        comp = Compactor(cfg, step_hook=hook, timeout=60)
        await comp.start(schedule=False)
        await comp.open_client(layout)
        await comp.submit("laptop", sid)
        await comp.drain()

    asyncio.run(main())
""")


@pytest.mark.parametrize("kill_at", ["llm", "install", "archive"])
def test_kill_9_during_an_incremental_compaction_converges(fake, layout, kill_at):
    sid = "2026-11-30T02-41-07Z-0401"
    write_session(layout, sid, 3)

    async def prepare() -> None:
        comp = await started(Compactor(config(fake)), layout)
        try:
            await compact(comp, sid)
            await comp.restore("laptop", sid)
        finally:
            await comp.close()

    asyncio.run(prepare())
    full = append(layout, sid, 4, 2)
    base = base_file(layout, sid).read_bytes()
    if kill_at == "llm":
        fake.set_mode("hang")
    asked = len(fake.requests)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(layout.memory_dir), sid, fake.base_url, kill_at], cwd=REPO
    )
    try:
        if kill_at == "llm":
            # The child's incremental request is held in the LLM: kill it there.
            while len(fake.requests) == asked and child.poll() is None:
                time.sleep(0.02)
            os.kill(child.pid, signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        fake.set_mode("ok")
    # No half summary anywhere, the transcript whole, the base kept.
    assert layout.session_file(sid).read_bytes() == full
    if kill_at != "archive":
        assert not layout.summary_file(sid).exists()
    assert base_file(layout, sid).read_bytes() == base

    async def converge() -> None:
        comp = await started(Compactor(config(fake)), layout)
        try:
            comp.step()
            await comp.drain()
        finally:
            await comp.close()

    asyncio.run(converge())
    assert Store(layout).load()[sid].state == S.COMPACTED
    text = layout.summary_file(sid).read_text()
    assert all(f in text for f in ("FACT-1", "FACT-3", "FACT-new4", "FACT-new5"))
    assert layout.archive_file(sid).read_bytes() == full
    assert not layout.session_file(sid).exists() and not base_file(layout, sid).exists()
    assert list(layout.tmp_dir.iterdir()) == []
    assert not any("Old question" in p for p in fake.prompts()[asked:])
