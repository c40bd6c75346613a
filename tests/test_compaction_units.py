"""The pieces of #17 on their own: the base's text round trip, update prompts, the ledger."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from memd.compaction.base import unshape_body
from memd.compaction.files import FileGuard, Superseded, install_summary, sha256
from memd.compaction.store import Store
from memd.compaction.update import summarize_update
from memd.compaction.usage import Ledger, Usage, day_of, estimate_tokens, next_day, reported
from memd.layout import ClientLayout
from memd.markdown import render_summary


def test_the_base_is_the_text_the_llm_wrote():
    body = "Intro.\n\n# Top\n\ntext\n\n### Deep\n\n```bash\n# not a heading\n---\n```\n\n---\nend"
    now = datetime(2026, 11, 30, tzinfo=UTC)
    text = render_summary(
        "c",
        "s",
        body,
        start=now,
        end=now,
        compacted_at=0,
        provider="p",
        model="m",
        parts=1,
        source_sha256="x",
    )
    assert unshape_body(text) == body
    again = render_summary(
        "c",
        "s",
        unshape_body(text),
        start=now,
        end=now,
        compacted_at=0,
        provider="p",
        model="m",
        parts=1,
        source_sha256="x",
    )
    assert again == text  # cycle after cycle, headings are dated once


def test_update_sends_the_base_and_the_new_text_once_when_they_fit():
    prompts: list[str] = []

    async def call(prompt: str) -> str:
        prompts.append(prompt)
        return "updated"

    out = asyncio.run(
        summarize_update(
            "BASE-TEXT", "## new exchange\n\nhello", call, span="S", max_request_chars=4000
        )
    )
    assert out.text == "updated" and out.requests == 1
    [prompt] = prompts
    assert prompt.count("BASE-TEXT") == 1 and "hello" in prompt


def test_update_of_a_long_new_part_stays_bounded_and_sends_the_base_once():
    prompts: list[str] = []

    async def call(prompt: str) -> str:
        prompts.append(prompt)
        return "s" * 200

    new = "".join(
        f"## 2026-11-30 02:4{n % 10}:07 UTC · exchange {n}\n\n" + "z" * 900 + "\n\n"
        for n in range(20)
    )
    out = asyncio.run(summarize_update("BASE-TEXT", new, call, span="S", max_request_chars=3000))
    assert max(len(p) for p in prompts) <= 3000
    assert sum("BASE-TEXT" in p for p in prompts) == 1
    assert out.requests == len(prompts) and out.parts > 1


def test_ledger_counts_per_session_and_day_and_reloads(tmp_path):
    store = Store(ClientLayout(tmp_path, "laptop"))
    ledger = Ledger(store.usage_rows(), store.add_usage)
    one = Usage()
    one.record("x" * 40, "y" * 8, None)  # no usage from the API: estimated
    one.record("p", "a", (100, 20))
    ledger.add("s1", "2026-12-01", one)
    ledger.add("s2", "2026-12-02", one)
    ledger.add("s3", "2026-12-02", Usage())  # no calls: no row
    again = Ledger(store.usage_rows())
    assert again.rows == ledger.rows and len(again.rows) == 2
    summary = again.summary("2026-12-02")
    assert summary["today"] == {
        "input_tokens": 110,
        "output_tokens": 22,
        "requests": 2,
        "estimated_requests": 1,
    }
    assert summary["total"]["input_tokens"] == 220
    assert again.summary("2026-12-02", "s1")["today"]["requests"] == 0
    assert again.today("2026-12-01").input_tokens == 110


def test_days_are_utc_days_and_estimates_round_up():
    ts = datetime(2026, 12, 1, 23, 59, 59, tzinfo=UTC).timestamp()
    assert day_of(ts) == "2026-12-01" and day_of(ts + 1) == "2026-12-02"
    assert next_day(ts) == ts + 1 and next_day(ts + 1) == ts + 1 + 86_400
    assert estimate_tokens("abcde") == 2 and estimate_tokens("") == 0


def test_usage_is_read_from_each_sdk_shape():
    class Obj:
        def __init__(self, **kw: object) -> None:
            self.__dict__.update(kw)

    assert reported(Obj(usage=Obj(prompt_tokens=5, completion_tokens=2))) == (5, 2)
    assert reported(Obj(usage=Obj(input_tokens=7, output_tokens=3))) == (7, 3)
    assert reported(Obj(usage_metadata=Obj(prompt_token_count=9, candidates_token_count=None))) == (
        9,
        0,
    )
    assert reported(Obj(usage=None)) is None and reported(Obj()) is None


def test_a_closed_guard_refuses_every_later_step(tmp_path):
    """Once the Compactor closed a client, a step its cancelled job left behind does nothing."""
    layout = ClientLayout(tmp_path, "laptop")
    layout.ensure()
    sid = "2026-11-30T02-41-07Z-0c10"
    source = layout.session_file(sid)
    source.write_bytes(b"transcript")
    guard = FileGuard()
    token = guard.token(sid)
    guard.close()
    with pytest.raises(Superseded):
        install_summary(layout, sid, "summary", source, sha256(b"transcript"), guard, token)
    assert not layout.summary_file(sid).exists()
