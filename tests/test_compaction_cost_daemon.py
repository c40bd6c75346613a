"""#17 through a real `memd run`: the base after a resume, tokens and the cap in status.

Same set-up as tests/test_compaction_daemon.py (1.8 s sessions, the fake LLM on
127.0.0.1, which reports `usage` as ceil(chars / 4)).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.daemon import REPO
from tests.support.fake_llm import FakeLLM
from tests.test_compaction_daemon import (
    CLIENT,
    Chat,
    compacted,
    compaction_state,
    session,
    settings,
    sources_once,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        server.retry_after_ms = 5
        yield server


def test_resume_sends_only_new_exchanges_and_tokens_show(
    tmp_path, config_file, daemon_factory, fake
) -> None:
    memd = daemon_factory(config_file(**settings(fake)))
    root = tmp_path / "memory" / CLIENT
    chat = Chat(memd)
    sid = chat.say("My bike lock code is FACT-lock42.", "Noted the code.")["session_id"]
    wait_for(lambda: compacted(memd, sid), "the first compaction", memd)
    first = len(fake.requests)
    spent = session(memd, sid)["compaction"]["tokens"]["total"]
    assert spent["input_tokens"] > 0 and spent["requests"] == first
    assert spent["estimated_requests"] == 0

    again = chat.say("The bike is a FACT-gravel frame.", "Nice bike.")
    assert again["session_id"] == sid
    assert (root / ".memd" / "compaction-base" / f"{sid}-summary.md").exists()
    row = session(memd, sid)  # active again, no state row, but what it spent still shows
    assert row["compaction"]["state"] is None
    assert row["compaction"]["tokens"]["total"] == spent
    wait_for(lambda: compacted(memd, sid), "the incremental compaction", memd)
    prompts = fake.prompts()[first:]
    assert len(prompts) == 1
    # The old exchange is not sent again (only the conversation's title, in new headings).
    assert "FACT-gravel" in prompts[0] and "Noted the code." not in prompts[0]
    assert "FACT-lock42" in prompts[0]  # through the base summary
    text = (root / "sessions" / f"{sid}-summary.md").read_text()
    assert "FACT-lock42" in text and "FACT-gravel" in text
    archived = (root / "archive" / f"{sid}.md").read_text()
    assert "bike lock code" in archived and "FACT-gravel" in archived
    summary = f"sessions/{sid}-summary.md"
    wait_for(
        lambda: sources_once(memd, "bike FACT-lock42", "FACT-lock42", {summary}),
        "recall to find the old fact in the new summary",
        memd,
    )

    status = memd.call("daemon.status")
    tokens = status["compaction"]["tokens"]
    assert tokens["today"]["requests"] == tokens["total"]["requests"] == len(fake.requests)
    assert status["clients"][CLIENT]["compaction"]["tokens"] == tokens
    assert status["compaction"]["cap"]["max_input_tokens_per_day"] == 2_000_000


def test_the_cap_defers_and_status_says_so(tmp_path, config_file, daemon_factory, fake) -> None:
    conf = settings(fake)
    conf["compaction"]["max_input_tokens_per_day"] = 1
    path = config_file(**conf)
    memd = daemon_factory(path)
    root = tmp_path / "memory" / CLIENT
    sids = []
    for fact in ("FACT-first", "FACT-second"):
        sid = Chat(memd).say(f"Remember {fact}.", "Done.")["session_id"]
        wait_for(
            lambda sid=sid: compaction_state(memd, sid) in ("compacted", "deferred"),
            "the compaction to run or wait",
            memd,
        )
        sids.append(sid)
    assert [compaction_state(memd, s) for s in sids] == ["compacted", "deferred"]
    row = session(memd, sids[1])
    assert row["state"] == "ended" and row["compaction"]["last_error"].startswith("deferred")
    assert row["compaction"]["next_retry"].endswith("T00:00:00Z")
    assert (root / "sessions" / f"{sids[1]}.md").exists()  # untouched, still searchable
    wait_for(
        lambda: sources_once(
            memd,
            "Remember FACT-second",
            "FACT-second",
            {f"sessions/{sids[1]}.md", f"sessions/{sids[0]}-summary.md"},
        ),
        "the deferred transcript to stay recallable",
        memd,
    )
    status = memd.call("daemon.status")["compaction"]
    assert status["deferred"] == 1 and status["cap"]["reached"] is True
    out = subprocess.run(
        [sys.executable, "-m", "memd.cli", "status", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "REACHED until" in out.stdout and "1 deferred" in out.stdout
