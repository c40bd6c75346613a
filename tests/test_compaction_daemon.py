"""Compaction through a real `memd run`: sessions expire, get summarised, resume, recompact.

Everything goes through the daemon's socket; the daemon's own pipeline (index server +
`memsearch watch`) indexes `sessions/`, so recall shows what the index holds. The LLM is
the fake HTTP server of tests/support/fake_llm.py, which echoes every `FACT-…` token it
was shown: a summary so says which transcript it was made from. Sessions last 1.8 s
(`session_inactivity_minutes = 0.03`), checked every 0.2 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from memd.markdown.summary import read_front_matter
from tests.support.daemon import DaemonProcess
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

CLIENT = "desk"
DEADLINE = 60.0


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        server.retry_after_ms = 5  # the SDK's own quick retries of a 500, kept quick
        yield server


def settings(fake: FakeLLM, *, enabled: bool = True, model: str = "fake") -> dict[str, Any]:
    return {
        "session_inactivity_minutes": 0.03,
        "monitor_interval_seconds": 0.2,
        "compaction": {
            "enabled": enabled,
            "llm_provider": "openai",
            "base_url": fake.base_url,
            "llm_model": model,
        },
        "clients": {CLIENT: {"memory_enabled": True, "mode": "both"}},
    }


class Chat:
    """One OpenAI-style chat, resent whole on every call as a stateless gateway does."""

    def __init__(self, memd: DaemonProcess) -> None:
        self.memd = memd
        self.messages: list[dict[str, str]] = []

    def say(self, user: str, reply: str) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": user})
        response = {"role": "assistant", "content": reply}
        out = self.memd.call(
            "memory.record_chat",
            {"client_id": CLIENT, "messages": list(self.messages), "response": response},
        )
        self.messages.append(response)
        return out


def wait_for(
    predicate: Callable[[], Any], what: str, memd: DaemonProcess, timeout: float = DEADLINE
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})\n{memd.log()}")


def session(memd: DaemonProcess, sid: str) -> dict[str, Any]:
    rows = memd.call("sessions.list", {"client_id": CLIENT})["sessions"]
    return next(r for r in rows if r["session_id"] == sid)


def compaction_state(memd: DaemonProcess, sid: str) -> str | None:
    return (session(memd, sid).get("compaction") or {}).get("state")


def compacted(memd: DaemonProcess, sid: str) -> bool:
    row = session(memd, sid)
    return row["state"] == "compacted" and row.get("compaction", {}).get("state") == "compacted"


def recall(memd: DaemonProcess, query: str) -> list[dict[str, Any]] | None:
    """The relevant sections (fewer than top_k exist), or None while the index starts."""
    try:
        return memd.call("memory.recall", {"client_id": CLIENT, "query": query, "top_k": 20})[
            "results"
        ]
    except RemoteError as exc:
        if exc.kind != "index_unavailable":
            raise
        return None


def sources_once(
    memd: DaemonProcess, query: str, needle: str, sources: set[str]
) -> list[dict[str, Any]] | None:
    """The results, once `needle` is found and every result comes from `sources`.

    A subset, not all of them: recall shows only what its score calls relevant (DESIGN
    §9), so a summary that holds none of the query's facts is rightly left out. What a
    source must no longer hold (a compacted transcript) still fails: its exchange holds
    the needle and the query's words, and would be shown."""
    results = recall(memd, query)
    if not results or not {r["source"] for r in results} <= sources:
        return None
    return results if any(needle in r["content"] for r in results) else None


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def summary_meta(root: Path, sid: str) -> dict[str, str]:
    return read_front_matter((root / "sessions" / f"{sid}-summary.md").read_text())


def test_compact_resume_compact_again_and_recompact(
    tmp_path, config_file, daemon_factory, fake
) -> None:
    config = config_file(**settings(fake))
    memd = daemon_factory(config)
    root = tmp_path / "memory" / CLIENT
    chat = Chat(memd)
    first = chat.say(
        "My kayak is called FACT-heron. Where do I store it?", "Keep the kayak in the boathouse."
    )
    sid = first["session_id"]
    assert first["new_conversation"] is True
    chat.say("And the paddle? It is FACT-carbon.", "The paddle goes on the wall rack.")
    live, summary = f"sessions/{sid}.md", f"sessions/{sid}-summary.md"

    # The session ends, is summarised, the transcript goes to archive/.
    wait_for(lambda: compacted(memd, sid), "the first compaction", memd)
    assert (root / "archive" / f"{sid}.md").exists()
    assert not (root / live).exists()
    text = (root / summary).read_text()
    assert "FACT-heron" in text and "FACT-carbon" in text
    assert summary_meta(root, sid)["llm_model"] == "fake"
    row = session(memd, sid)
    assert row["path"] == str(root / "archive" / f"{sid}.md")
    assert row["compaction"]["summary_path"] == str(root / summary)
    # The index holds the summary's chunks and none of the transcript's.
    wait_for(
        lambda: sources_once(memd, "kayak FACT-heron", "FACT-heron", {summary}),
        "recall to see only the summary",
        memd,
    )

    # The conversation goes on: the transcript comes back, the summary goes. The next
    # compaction is held in the LLM, so what happens meanwhile can be seen.
    fake.set_mode("hang")
    again = chat.say("I also bought a spray deck, FACT-neoprene.", "Dry it after use.")
    assert (again["session_id"], again["new_conversation"]) == (sid, False)
    assert again["appended"] == 2
    assert files(root / "sessions") == {f"{sid}.md"}
    assert not (root / "archive" / f"{sid}.md").exists()
    transcript = (root / live).read_text()
    assert "FACT-heron" in transcript and "FACT-neoprene" in transcript
    assert transcript.index("FACT-carbon") < transcript.index("FACT-neoprene")
    wait_for(
        lambda: sources_once(memd, "spray deck FACT-neoprene", "FACT-neoprene", {live}),
        "recall to see the restored transcript and the new exchange",
        memd,
    )

    # Recording and recall keep working while a (slow) compaction runs.
    wait_for(
        lambda: memd.call("daemon.status")["clients"][CLIENT]["compaction"]["running"] == [sid],
        "the second compaction to start",
        memd,
    )
    other = Chat(memd)
    for n in range(3):
        out = other.say(f"Unrelated question {n} about FACT-tide{n}?", f"Answer {n}.")
        assert out["appended"] == 2
    sid2 = out["session_id"]
    assert sid2 != sid
    assert recall(memd, "kayak") is not None
    status = memd.call("daemon.status")["clients"][CLIENT]["compaction"]
    assert status["running"] == [sid] and compaction_state(memd, sid) == "pending"
    fake.set_mode("ok")

    # Compacted again, from the whole transcript, the new exchange included.
    wait_for(lambda: compacted(memd, sid) and compacted(memd, sid2), "both compacted", memd)
    text = (root / summary).read_text()
    assert all(f in text for f in ("FACT-heron", "FACT-carbon", "FACT-neoprene"))
    assert "FACT-neoprene" in (root / "archive" / f"{sid}.md").read_text()
    # The fake summary keeps the token, not "spray deck": asked for what it holds (half
    # of "spray deck FACT-neoprene" scores it under the default bar with MiniLM).
    wait_for(
        lambda: sources_once(
            memd,
            "FACT-neoprene",
            "FACT-neoprene",
            {summary, f"sessions/{sid2}-summary.md"},
        ),
        "recall to see only the two summaries",
        memd,
    )

    # A new model in the config (hot reload), then re-compaction of everything.
    applied = memd.log().count("config.applied")
    config_file(**settings(fake, model="fake-2"))
    wait_for(lambda: memd.log().count("config.applied") > applied, "the reload", memd)
    results = memd.call("sessions.recompact", {"client_id": CLIENT})["results"]
    assert sorted((r["session_id"], r["result"]) for r in results) == [
        (sid, "recompacted"),
        (sid2, "recompacted"),
    ]
    for s in (sid, sid2):
        assert summary_meta(root, s)["llm_model"] == "fake-2"
        assert session(memd, s)["compaction"]["llm_model"] == "fake-2"
    assert fake.requests[-1].model == "fake-2"
    assert files(root / "sessions") == {f"{sid}-summary.md", f"{sid2}-summary.md"}
    assert files(root / "archive") == {f"{sid}.md", f"{sid2}.md"}
    assert not (root / "memory").exists()
    assert [p.name for p in (root / ".memd" / "tmp").iterdir()] == []


def test_llm_failure_keeps_the_transcript_until_a_retry_succeeds(
    tmp_path, config_file, daemon_factory, fake
) -> None:
    fake.set_mode("error", status=500)
    memd = daemon_factory(config_file(**settings(fake)))
    root = tmp_path / "memory" / CLIENT
    sid = Chat(memd).say("The boiler code is FACT-boiler7.", "Noted.")["session_id"]
    live = f"sessions/{sid}.md"

    wait_for(lambda: compaction_state(memd, sid) == "failed", "the failure", memd)
    info = session(memd, sid)
    assert info["state"] == "ended"
    assert info["compaction"]["last_error"].startswith("http_error: HTTP 500")
    assert info["compaction"]["attempts"] == 1 and info["compaction"]["next_retry"]
    [failure] = memd.call("daemon.status")["clients"][CLIENT]["compaction"]["failures"]
    assert failure["session_id"] == sid and failure["last_error"].startswith("http_error")
    assert files(root / "sessions") == {f"{sid}.md"}
    assert not (root / "archive").exists() or files(root / "archive") == set()
    wait_for(
        lambda: sources_once(memd, "boiler code", "FACT-boiler7", {live}),
        "the transcript to stay recallable",
        memd,
    )

    # The LLM is back; the retry (due in a minute by itself) is asked for now.
    fake.set_mode("ok")
    [result] = memd.call("sessions.recompact", {"client_id": CLIENT, "session_id": sid})["results"]
    assert result == {"session_id": sid, "result": "queued", "error": None}
    wait_for(lambda: compacted(memd, sid), "the retried compaction", memd)
    assert session(memd, sid)["compaction"]["last_error"] is None
    assert memd.call("daemon.status")["clients"][CLIENT]["compaction"]["failures"] == []
    assert "FACT-boiler7" in (root / "sessions" / f"{sid}-summary.md").read_text()
    assert files(root / "archive") == {f"{sid}.md"}
    wait_for(
        lambda: sources_once(
            memd, "boiler code FACT-boiler7", "FACT-boiler7", {f"sessions/{sid}-summary.md"}
        ),
        "recall to see only the summary",  # the fake LLM's summary keeps only the token
        memd,
    )


def test_disabled_compaction_keeps_sessions_until_asked(
    tmp_path, config_file, daemon_factory, fake
) -> None:
    """Three ended sessions stay in sessions/; a request to compact them is refused until
    compaction is enabled (issue #14), then they are compacted together, all recallable."""
    memd = daemon_factory(config_file(**settings(fake, enabled=False)))
    root = tmp_path / "memory" / CLIENT
    facts = ["FACT-plot42", "FACT-shed9", "FACT-hose3"]
    sids = []
    for fact in facts:  # one session each: the next chat starts once the last one ended
        sid = Chat(memd).say(f"The allotment note is {fact}.", "Got it.")["session_id"]
        wait_for(lambda sid=sid: session(memd, sid)["state"] == "ended", "an end", memd)
        sids.append(sid)
    assert len(set(sids)) == 3
    assert all("compaction" not in session(memd, sid) for sid in sids)
    assert files(root / "sessions") == {f"{sid}.md" for sid in sids}
    live = {f"sessions/{sid}.md" for sid in sids}
    for fact in facts:
        wait_for(
            lambda fact=fact: sources_once(memd, f"allotment {fact}", fact, live),
            "the ended sessions to stay recallable",
            memd,
        )
    assert fake.requests == []
    with pytest.raises(RemoteError) as refused:
        memd.call("sessions.recompact", {"client_id": CLIENT})
    assert refused.value.kind == "compaction_disabled"
    assert fake.requests == []

    applied = memd.log().count("config.applied")
    config_file(**settings(fake))
    wait_for(lambda: memd.log().count("config.applied") > applied, "the reload", memd)
    results = memd.call("sessions.recompact", {"client_id": CLIENT})["results"]
    assert sorted(r["session_id"] for r in results) == sids
    assert {r["result"] for r in results} == {"queued"}
    wait_for(lambda: all(compacted(memd, sid) for sid in sids), "the compactions", memd)
    assert len(fake.requests) == 3
    assert files(root / "sessions") == {f"{sid}-summary.md" for sid in sids}
    assert files(root / "archive") == {f"{sid}.md" for sid in sids}
    # Three summaries appear within milliseconds: every one of them must be indexed.
    summaries = {f"sessions/{sid}-summary.md" for sid in sids}
    for fact in facts:
        wait_for(
            lambda fact=fact: sources_once(memd, f"allotment {fact}", fact, summaries),
            f"recall to find {fact} in the summaries only",
            memd,
        )
