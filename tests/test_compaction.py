"""Compaction against a real HTTP LLM stand-in: summaries, archive, failures, retries, restore."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from memsearch.chunker import chunk_markdown

from memd.compaction import llm
from memd.compaction.files import summary_meta
from memd.compaction.job import compact_session, restore
from memd.compaction.service import Compactor
from memd.compaction.store import Backoff, CompactionStates, Record, Store
from memd.markdown import parse_summary_title, read_front_matter, shape_body, transcript
from memd.markdown.transcript import Part
from memd.sessions.tracker import ClientSessions
from tests.support.compaction import (
    T0,
    Clock,
    aio,
    config,
    files_under,
    started,
    write_session,
)

S = CompactionStates
pytest_plugins = ("tests.support.compaction_fixtures",)


# --- the happy path --------------------------------------------------------------------------


@aio
async def test_compaction_writes_summary_and_archives_transcript(fake, layout):
    sid = "2026-11-30T02-41-07Z-0001"
    raw = write_session(layout, sid, 3)
    compacted: list[tuple[str, str]] = []
    clock = Clock()
    comp = await started(
        Compactor(config(fake), clock=clock, on_compacted=lambda c, s: compacted.append((c, s))),
        layout,
    )
    try:
        assert await comp.submit("laptop", sid)
        await comp.drain()
    finally:
        await comp.close()

    assert not layout.session_file(sid).exists()
    assert layout.archive_file(sid).read_bytes() == raw  # the raw transcript, byte for byte
    text = layout.summary_file(sid).read_text()
    meta = read_front_matter(text)
    assert meta["client_id"] == "laptop" and meta["session_id"] == sid
    assert meta["summary_of"] == f"sessions/{sid}.md"
    assert meta["archive"] == f"archive/{sid}.md"
    assert meta["llm_provider"] == "openai" and meta["llm_model"] == "fake-model"
    assert meta["compacted_at"] == transcript.iso(clock.now)
    assert meta["started"] == "2026-11-30T02:42:07Z" and meta["ended"] == "2026-11-30T02:44:07Z"
    assert meta["source_sha256"] == hashlib.sha256(raw).hexdigest()
    span = "2026-11-30 02:42:07 UTC – 2026-11-30 02:44:07 UTC"
    assert f"\n# {span} · session summary\n" in text
    assert f"## {span} · summary · Facts" in text  # the LLM's heading, dated and demoted
    for n in (1, 2, 3):
        assert f"FACT-{n}" in text
    assert compacted == [("laptop", sid)]
    assert fake.requests[0].authorization == "Bearer sk-test"
    assert fake.requests[0].model == "fake-model"
    rec = Store(layout).load()[sid]
    assert rec.state == S.COMPACTED and rec.llm_model == "fake-model" and rec.requests == 1
    # Nothing else anywhere: no memory/ folder, no temp file, only state in .memd/.
    left = {f for f in files_under(layout.root) if not f.startswith(".memd/compaction.sqlite3")}
    assert left == {f"sessions/{sid}-summary.md", f"archive/{sid}.md"}
    assert not (layout.root / "memory").exists()
    assert list(layout.tmp_dir.iterdir()) == []


@aio
async def test_summary_chunks_all_carry_the_session_dates(fake, layout):
    sid = "2026-11-30T02-41-07Z-0002"
    write_session(layout, sid, 2)
    fake.summary = lambda prompt: (
        "Intro line.\n\n# Top\n\ntext\n\n### Deep\n\nmore\n\n"
        "```bash\n# a comment, not a heading\n---\n```\n"
    )
    comp = await started(Compactor(config(fake)), layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
    finally:
        await comp.close()
    text = layout.summary_file(sid).read_text()
    chunks = chunk_markdown(text, source="x")
    headed = [c for c in chunks if c.heading]
    assert {c.heading_level for c in headed} == {1, 2, 4}
    for chunk in headed:
        start, end = parse_summary_title(chunk.heading)
        assert (start.isoformat(), end.isoformat()) == (
            "2026-11-30T02:42:07+00:00",
            "2026-11-30T02:43:07+00:00",
        )
    assert "\\# a comment, not a heading" in text  # code stays in its chunk


def test_shape_body_demotes_headings_and_escapes_code():
    body = shape_body("# A\n~~~\n## not me\n~~~\n###### six\n#nospace", "SPAN")
    assert body.split("\n") == [
        "## SPAN · summary · A",
        "~~~",
        "\\## not me",
        "~~~",
        "###### SPAN · summary · six",
        "#nospace",
    ]
    assert parse_summary_title("Facts") is None


# --- bounded input ---------------------------------------------------------------------------


@aio
async def test_long_session_is_summarised_in_bounded_parts(fake, layout):
    sid = "2026-11-30T02-41-07Z-0003"
    write_session(layout, sid, 80, filler=60)  # ~30 kB
    bound = 4_000
    comp = await started(Compactor(config(fake), max_request_chars=bound), layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
    finally:
        await comp.close()
    sizes = [r.prompt_chars for r in fake.requests]
    assert max(sizes) <= bound
    meta = summary_meta(layout, sid)
    parts = int(meta["parts"])
    assert parts >= 8 and len(sizes) > parts  # parts, then combining requests
    text = layout.summary_file(sid).read_text()
    for n in range(1, 81):  # every part's facts made it through the merges
        assert f"FACT-{n}\n" in text
    # Parts were cut only at exchange boundaries.
    for prompt in fake.prompts()[:parts]:
        body = prompt.split("Transcript:\n", 1)[1]
        assert body.startswith(("# Conversation", "## "))
        assert re.search(r"\*\*Assistant:\*\* Noted \d+\.$", body.rstrip())


def test_split_text_cuts_an_oversized_exchange_by_characters():
    big = "## 2026-11-30 02:42:07 UTC · exchange 1\n\n**User:** " + "x" * 5000 + "\n\n"
    small = "## 2026-11-30 02:43:07 UTC · exchange 2\n\n**User:** hi\n\n"
    parts = llm.split_text(big + small, 1000)
    assert all(len(p) <= 1000 for p in parts)
    assert (
        "".join(
            p.replace("## 2026-11-30 02:42:07 UTC · exchange 1 (continued)\n\n", "") for p in parts
        )
        == big + small
    )
    assert parts[1].startswith("## 2026-11-30 02:42:07 UTC · exchange 1 (continued)")
    assert parts[-1].endswith(small)


@aio
async def test_merging_always_ends_even_when_the_llm_ignores_lengths():
    calls: list[int] = []

    async def verbose(prompt: str) -> str:
        calls.append(len(prompt))
        return "y" * 3000  # far longer than asked

    text = "".join(
        f"## 2026-11-30 02:4{n}:07 UTC · exchange {n}\n\n" + "z" * 1500 + "\n\n" for n in range(8)
    )
    result = await llm.summarize(text, verbose, span="S", max_request_chars=4000)
    assert max(calls) <= 4000 and result.text == "y" * 3000


# --- failures and retries --------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["unreachable", "http_500", "http_429", "timeout", "empty"])
@aio
async def test_llm_failure_leaves_transcript_and_retries(fake, layout, failure):
    sid = "2026-11-30T02-41-07Z-0004"
    raw = write_session(layout, sid, 2)
    clock = Clock()
    if failure == "unreachable":
        fake.go_down()
    elif failure.startswith("http_"):
        fake.set_mode("error", status=int(failure[5:]))
    elif failure == "timeout":
        fake.set_mode("hang")
    else:
        fake.set_mode("empty")
    timeout = 1.0 if failure == "timeout" else 30.0  # the SDK's own retries take a while
    comp = Compactor(config(fake), clock=clock, timeout=timeout, backoff=Backoff(60, 3600))
    await started(comp, layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
        assert layout.session_file(sid).read_bytes() == raw  # untouched, still indexed
        assert not layout.summary_file(sid).exists()
        assert not layout.archive_file(sid).exists()
        assert list(layout.tmp_dir.iterdir()) == []
        info = comp.sessions("laptop")[sid]
        reason = failure.split("_")[0] if failure != "timeout" else "timeout"
        assert info["state"] == S.FAILED and info["attempts"] == 1
        assert info["last_error"].startswith(reason.replace("http", "http_error"))
        assert info["next_retry"] == transcript.iso(clock.now + 60)
        assert comp.client_status("laptop")["failures"][0]["session_id"] == sid
        assert comp.step(clock.now + 59) == 0  # not before its time
        fake.come_up()
        fake.set_mode("ok")
        assert comp.step(clock.now + 60) == 1
        await comp.drain()
    finally:
        await comp.close()
    assert layout.archive_file(sid).read_bytes() == raw
    assert layout.summary_file(sid).exists()
    assert Store(layout).load()[sid].state == S.COMPACTED


@aio
async def test_backoff_doubles_up_to_the_cap_and_survives_a_restart(fake, layout):
    sid = "2026-11-30T02-41-07Z-0005"
    write_session(layout, sid, 1)
    fake.set_mode("empty")
    clock = Clock()
    comp = await started(Compactor(config(fake), clock=clock, backoff=Backoff(1, 5)), layout)
    delays = []
    try:
        await comp.submit("laptop", sid)
        for _ in range(5):
            await comp.drain()
            rec = Store(layout).load()[sid]
            delays.append(rec.next_retry - clock.now)
            clock.now = rec.next_retry
            comp.step()
        await comp.drain()
    finally:
        await comp.close()
    assert delays == [1, 2, 4, 5, 5]
    rec = Store(layout).load()[sid]
    assert (rec.state, rec.attempts) == (S.FAILED, 6)
    # A new daemon picks the failure up at its retry time.
    fake.set_mode("ok")
    comp = await started(Compactor(config(fake), clock=clock, backoff=Backoff(1, 5)), layout)
    try:
        assert comp.step(rec.next_retry - 0.5) == 0
        assert comp.step(rec.next_retry) == 1
        await comp.drain()
    finally:
        await comp.close()
    assert Store(layout).load()[sid].state == S.COMPACTED


@aio
async def test_pending_compaction_resumes_after_restart(fake, layout):
    sid = "2026-11-30T02-41-07Z-0006"
    write_session(layout, sid, 1)
    comp = Compactor(config(fake))
    await comp.open_client(layout)  # no workers: the daemon stops before it runs
    await comp.submit("laptop", sid)
    await comp.close()
    assert Store(layout).load()[sid].state == S.PENDING
    comp = await started(Compactor(config(fake)), layout)
    try:
        assert comp.step() == 1
        await comp.drain()
    finally:
        await comp.close()
    assert layout.archive_file(sid).exists()


@aio
async def test_scheduler_retries_by_itself(fake, layout):
    sid = "2026-11-30T02-41-07Z-0007"
    write_session(layout, sid, 1)
    fake.set_mode("empty")
    comp = Compactor(config(fake), backoff=Backoff(0.2, 0.2))
    await comp.start()
    await comp.open_client(layout)
    try:
        await comp.submit("laptop", sid)
        while not fake.requests:
            await asyncio.sleep(0.01)
        fake.set_mode("ok")
        for _ in range(500):
            if comp.sessions("laptop")[sid]["state"] == S.COMPACTED:
                break
            await asyncio.sleep(0.02)
    finally:
        await comp.close()
    assert Store(layout).load()[sid].state == S.COMPACTED


@aio
async def test_deleted_transcript_is_missing_not_retried(fake, layout):
    comp = await started(Compactor(config(fake)), layout)
    try:
        await comp.submit("laptop", "2026-11-30T02-41-07Z-0008")
        await comp.drain()
        assert comp.sessions("laptop")["2026-11-30T02-41-07Z-0008"]["state"] == S.MISSING
        assert comp.step(float("inf")) == 0
    finally:
        await comp.close()
    assert fake.requests == []


# --- crashes between steps -------------------------------------------------------------------


@aio
async def test_crash_after_summary_before_archive_converges_without_llm(fake, layout):
    sid = "2026-11-30T02-41-07Z-0009"
    raw = write_session(layout, sid, 2)
    settings = llm.LLMSettings(base_url=fake.base_url, api_key="k", model="m")
    await compact_session(layout, sid, settings)
    summary = layout.summary_file(sid).read_bytes()
    # The state a crash after step 1 leaves: summary in place, transcript still live.
    os.replace(layout.archive_file(sid), layout.session_file(sid))
    (layout.tmp_dir / "compaction.x.abc.tmp").write_text("half")  # and a half-written temp
    asked = len(fake.requests)
    store = Store(layout)
    store.put(Record(sid, S.PENDING, updated=T0))
    store.close()
    comp = await started(Compactor(config(fake)), layout)
    try:
        assert comp.step() == 1
        await comp.drain()
    finally:
        await comp.close()
    assert len(fake.requests) == asked  # the summary on disk was reused
    assert layout.summary_file(sid).read_bytes() == summary
    assert layout.archive_file(sid).read_bytes() == raw
    assert not layout.session_file(sid).exists()
    assert list(layout.tmp_dir.iterdir()) == []


@aio
async def test_stale_summary_is_replaced(fake, layout):
    sid = "2026-11-30T02-41-07Z-0010"
    write_session(layout, sid, 1)
    settings = llm.LLMSettings(base_url=fake.base_url, api_key="k", model="m")
    await compact_session(layout, sid, settings)
    # The transcript came back and grew (restore crashed before dropping the summary).
    os.replace(layout.archive_file(sid), layout.session_file(sid))
    with layout.session_file(sid).open("a") as fh:
        fh.write(
            transcript.exchange_block(
                2, datetime.fromtimestamp(T0 + 600, UTC), [Part("User", "and FACT-new")]
            )
        )
    out = await compact_session(layout, sid, settings)
    assert out.result == "compacted"
    assert "FACT-new" in layout.summary_file(sid).read_text()
    assert "FACT-new" in layout.archive_file(sid).read_text()
    # Running it once more finds the work done.
    assert (await compact_session(layout, sid, settings)).result == "already"


@aio
async def test_interrupted_restore_is_finished_on_open(fake, layout):
    sid = "2026-11-30T02-41-07Z-0011"
    write_session(layout, sid, 1)
    settings = llm.LLMSettings(base_url=fake.base_url, api_key="k", model="m")
    await compact_session(layout, sid, settings)
    store = Store(layout)
    store.put(Record(sid, S.RESTORING, updated=T0))  # intent recorded, then:
    store.close()
    os.replace(layout.archive_file(sid), layout.session_file(sid))  # crash after the move
    comp = await started(Compactor(config(fake)), layout)
    try:
        assert sid not in comp.sessions("laptop")
    finally:
        await comp.close()
    assert layout.session_file(sid).exists()
    assert not layout.summary_file(sid).exists()


# --- restore and re-compaction ---------------------------------------------------------------


@aio
async def test_restore_then_compact_again(fake, layout):
    sid = "2026-11-30T02-41-07Z-0012"
    raw = write_session(layout, sid, 2)
    comp = await started(Compactor(config(fake)), layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
        assert await comp.restore("laptop", sid) == "restored"
        assert layout.session_file(sid).read_bytes() == raw
        assert not layout.summary_file(sid).exists()
        assert not layout.archive_file(sid).exists()
        assert sid not in comp.sessions("laptop")
        assert Store(layout).load() == {}
        with layout.session_file(sid).open("a") as fh:  # the conversation goes on
            fh.write(
                transcript.exchange_block(
                    3, datetime.fromtimestamp(T0 + 900, UTC), [Part("User", "FACT-later")]
                )
            )
        await comp.submit("laptop", sid)
        await comp.drain()
    finally:
        await comp.close()
    assert "FACT-later" in layout.summary_file(sid).read_text()
    assert "FACT-later" in layout.archive_file(sid).read_text()
    assert not layout.session_file(sid).exists()


@aio
async def test_compaction_state_is_written_off_the_event_loop(fake, layout):
    """sqlite never runs on the loop: every statement of a compaction, a restore and the
    close runs on the client's own sqlite thread."""
    sid = "2026-11-30T02-41-07Z-001b"
    write_session(layout, sid, 1)
    comp = await started(Compactor(config(fake)), layout)
    threads: set[str] = set()
    db = comp._clients["laptop"].store.db  # reaching in: the connection the records own
    db.set_trace_callback(lambda _sql: threads.add(threading.current_thread().name))
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
        assert await comp.restore("laptop", sid) == "restored"
    finally:
        await comp.close()
    assert threads and all(name.startswith("memd-compaction-laptop") for name in threads)
    assert Store(layout).load() == {}


@aio
async def test_restore_cancels_a_compaction_in_flight(fake, layout):
    sid = "2026-11-30T02-41-07Z-0013"
    raw = write_session(layout, sid, 1)
    fake.set_mode("hang")
    comp = await started(Compactor(config(fake), timeout=30), layout)
    try:
        await comp.submit("laptop", sid)
        while not fake.requests:
            await asyncio.sleep(0.01)
        assert await comp.restore("laptop", sid) == "restored"
        await comp.drain()
        assert comp.sessions("laptop") == {}
    finally:
        await comp.close()
        fake.set_mode("ok")
    assert layout.session_file(sid).read_bytes() == raw
    assert files_under(layout.sessions) == {f"{sid}.md"}


@pytest.mark.parametrize("held", ["install", "archive"])
def test_restore_wins_over_a_file_step_that_a_cancel_cannot_stop(fake, layout, held):
    """File steps run in threads: once one started, cancelling its task cannot stop it.

    The step hook holds that thread just before it takes the client's file lock, restore
    runs to its end, then the step is let go: it must find the restore and do nothing.
    """
    sid = "2026-11-30T02-41-07Z-0019"
    raw = write_session(layout, sid, 2)
    at_step, go = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def hold(step: str, session_id: str) -> None:
        if step == held:
            at_step.set()
            go.wait(10)

    async def scenario() -> None:
        comp = await started(Compactor(config(fake), step_hook=hold), layout)
        try:
            await comp.submit("laptop", sid)
            assert await asyncio.to_thread(at_step.wait, 10)
            assert layout.summary_file(sid).exists() == (held == "archive")
            seen["restore"] = await comp.restore("laptop", sid)
            seen["after_restore"] = files_under(layout.sessions)
            go.set()
            seen["state"] = comp.sessions("laptop")
        finally:
            go.set()
            await comp.close()

    asyncio.run(scenario())  # returns once the loop's worker threads, the held one too, end
    assert seen == {"restore": "restored", "after_restore": {f"{sid}.md"}, "state": {}}
    assert layout.session_file(sid).read_bytes() == raw  # still there, and stays there
    assert files_under(layout.sessions) == {f"{sid}.md"}
    assert not layout.archive_file(sid).exists()
    assert list(layout.tmp_dir.iterdir()) == []


@aio
async def test_restore_cancels_a_recompaction_in_flight(fake, layout):
    sid = "2026-11-30T02-41-07Z-001a"
    raw = write_session(layout, sid, 1)
    comp = await started(Compactor(config(fake), timeout=30), layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
        fake.set_mode("hang")
        asked = len(fake.requests)
        recompacting = asyncio.create_task(comp.recompact("laptop", sid))
        while len(fake.requests) == asked:
            await asyncio.sleep(0.01)
        assert comp.client_status("laptop")["running"] == [sid]
        assert await comp.restore("laptop", sid) == "restored"
        [result] = await recompacting
        assert result["result"] == "cancelled"
        assert comp.sessions("laptop") == {}
    finally:
        fake.set_mode("ok")
        await comp.close()
    assert layout.session_file(sid).read_bytes() == raw
    assert files_under(layout.sessions) == {f"{sid}.md"}


def test_restore_function_without_a_compactor(layout):
    sid = "2026-11-30T02-41-07Z-0014"
    raw = write_session(layout, sid, 1)
    os.replace(layout.session_file(sid), layout.archive_file(sid))
    layout.summary_file(sid).write_text("---\nsession_id: x\n---\n\n# s\n\nsummary\n")
    assert restore(layout, sid) == "restored"
    assert layout.session_file(sid).read_bytes() == raw
    assert not layout.summary_file(sid).exists()
    assert restore(layout, sid) == "restored"  # idempotent
    assert restore(layout, "2026-11-30T02-41-07Z-ffff") == "missing"


@aio
async def test_recompact_all_after_changing_the_model(fake, layout):
    sids = ["2026-11-30T02-41-07Z-0015", "2026-11-30T02-41-07Z-0016"]
    raws = [write_session(layout, sid, 2, fact_prefix=f"s{i}-") for i, sid in enumerate(sids)]
    live = "2026-11-30T02-41-07Z-0017"
    write_session(layout, live, 1)  # not compacted: recompaction leaves it alone
    comp = await started(Compactor(config(fake, llm_model="m1")), layout)
    progress: list[tuple[int, int, str]] = []
    try:
        for sid in sids:
            await comp.submit("laptop", sid)
        await comp.drain()
        comp.set_config(config(fake, llm_model="m2"))
        results = await comp.recompact("laptop", on_progress=lambda *a: progress.append(a))
    finally:
        await comp.close()
    assert progress == [(1, 2, sids[0]), (2, 2, sids[1])]
    assert [r["result"] for r in results] == ["recompacted", "recompacted"]
    for sid, raw in zip(sids, raws, strict=True):
        assert summary_meta(layout, sid)["llm_model"] == "m2"
        assert layout.archive_file(sid).read_bytes() == raw
    assert fake.requests[-1].model == "m2"
    assert layout.session_file(live).exists() and not layout.summary_file(live).exists()
    assert Store(layout).load()[sids[0]].llm_model == "m2"


@aio
async def test_failed_recompact_keeps_the_old_summary(fake, layout):
    sid = "2026-11-30T02-41-07Z-0018"
    write_session(layout, sid, 1)
    comp = await started(Compactor(config(fake)), layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
        before = layout.summary_file(sid).read_bytes()
        fake.set_mode("empty")
        [result] = await comp.recompact("laptop", sid)
        assert result["result"] == "failed" and result["error"].startswith("empty")
        info = comp.sessions("laptop")[sid]
        assert info["state"] == S.COMPACTED and info["last_error"].startswith("empty")
    finally:
        await comp.close()
    assert layout.summary_file(sid).read_bytes() == before


# --- concurrency and enablement --------------------------------------------------------------


@pytest.mark.parametrize("bound", [1, 2])
@aio
async def test_concurrent_compactions_stay_within_the_bound(fake, layout, bound):
    # The LLM holds every answer until the test lets go, so the runs overlap however slow
    # the machine is (a fixed delay let a loaded CI host finish each call before the next).
    fake.set_mode("hang")
    sids = [f"2026-11-30T02-41-07Z-{n:04x}" for n in range(0x20, 0x25)]
    for sid in sids:
        write_session(layout, sid, 1)
    comp = await started(Compactor(config(fake), max_concurrent=bound), layout)
    try:
        for sid in sids:
            await comp.submit("laptop", sid)
        for _ in range(600):  # up to 60 s for `bound` calls to reach the LLM
            if fake.in_flight >= bound:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # room for a call beyond the bound to show up
        assert fake.in_flight == bound
        fake.set_mode("ok")
        await comp.drain()
    finally:
        await comp.close()
    assert fake.max_in_flight == bound
    assert all(layout.archive_file(sid).exists() for sid in sids)


@aio
async def test_disabled_compaction_keeps_sessions_until_requested(fake, layout):
    sid = "2026-11-30T02-41-07Z-0030"
    raw = write_session(layout, sid, 1)
    comp = await started(Compactor(config(fake, enabled=False)), layout)
    try:
        await comp.on_end_hook(layout)({"session_id": sid, "state": "ended"})
        assert comp.step(float("inf")) == 0
        await comp.drain()
        assert layout.session_file(sid).read_bytes() == raw and fake.requests == []
        assert comp.sessions("laptop") == {}
        await comp.submit("laptop", sid, force=True)  # compact on request
        await comp.drain()
    finally:
        await comp.close()
    assert layout.archive_file(sid).read_bytes() == raw


@aio
async def test_custom_base_url_never_gets_the_openai_key(fake, layout, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-personal")
    out = await llm.complete(llm.LLMSettings(base_url=fake.base_url, timeout=5), "hi FACT-1")
    assert "FACT-1" in out
    assert fake.requests[0].authorization == "Bearer memd-no-key"


# --- wired to the real session store ---------------------------------------------------------


@aio
async def test_session_end_hook_compacts_and_marks_compacted(fake, layout):
    comp = Compactor(config(fake))
    sessions = ClientSessions(layout, on_end=[comp.on_end_hook(layout)])

    async def mark(client_id: str, session_id: str) -> None:
        await sessions.mark_compacted(session_id)

    comp.on_compacted = mark
    await comp.start(schedule=False)
    await comp.open_client(layout)
    try:
        async with sessions:
            rec = await sessions.record_exchange("c1", "my cat is FACT-cat", "Nice cat.")
            sid = rec["session_id"]
            await sessions.close_active()
            await comp.drain()
            [info] = await sessions.list_sessions()
    finally:
        await comp.close()
    assert info["state"] == "compacted" and info["path"] == str(layout.archive_file(sid))
    assert "FACT-cat" in layout.summary_file(sid).read_text()
    assert not layout.session_file(sid).exists()


@aio
async def test_transcript_that_changes_during_the_llm_call_is_not_archived(fake, layout):
    sid = "2026-11-30T02-41-07Z-0031"
    write_session(layout, sid, 1)
    clock = Clock()

    def append_while_summarising(prompt: str) -> str:
        with layout.session_file(sid).open("a") as fh:
            fh.write(
                transcript.exchange_block(
                    2, datetime.fromtimestamp(T0 + 300, UTC), [Part("User", "FACT-late")]
                )
            )
        fake.summary = lambda p: "## Facts\n\n- fine\n"
        return "## Facts\n\n- stale\n"

    fake.summary = append_while_summarising
    comp = await started(Compactor(config(fake), clock=clock), layout)
    try:
        await comp.submit("laptop", sid)
        await comp.drain()
        info = comp.sessions("laptop")[sid]
        assert info["state"] == S.FAILED and "changed" in info["last_error"]
        assert not layout.summary_file(sid).exists() and not layout.archive_file(sid).exists()
        comp.step(clock.now + 3600)
        await comp.drain()
    finally:
        await comp.close()
    assert "FACT-late" in layout.archive_file(sid).read_text()
    assert "- fine" in layout.summary_file(sid).read_text()


@pytest.mark.parametrize(
    "provider, package", [("anthropic", "anthropic"), ("gemini", "google.genai")]
)
def test_provider_without_its_sdk_is_a_setup_error(provider, package):
    try:
        __import__(package)
    except ImportError:
        pass
    else:
        pytest.skip(f"{package} is installed")
    settings = llm.LLMSettings(provider=provider, model="m", api_key="k", timeout=5)
    with pytest.raises(llm.LLMError) as info:
        asyncio.run(llm.complete(settings, "hi"))
    assert info.value.reason == "setup" and "pip install" in str(info.value)


def test_anthropic_gets_the_configured_key_and_base_url(fake, monkeypatch):
    pytest.importorskip("anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env-should-not-be-used")
    settings = llm.LLMSettings(
        provider="anthropic",
        model="claude-x",
        api_key="sk-ant-config",
        base_url=fake.root_url,
        timeout=10,
    )
    out = asyncio.run(llm.complete(settings, "remember FACT-a"))
    assert "FACT-a" in out  # the text block, after the thinking block
    [req] = fake.requests
    assert (req.path, req.model) == ("/v1/messages", "claude-x")
    assert req.authorization.removeprefix("Bearer ") == "sk-ant-config"  # SDKs differ
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-env-should-not-be-used"
    fake.set_mode("empty")
    with pytest.raises(llm.LLMError) as info:
        asyncio.run(llm.complete(settings, "again"))
    assert info.value.reason == "empty"
