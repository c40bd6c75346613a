"""The socket methods the memory browser reads through: `browse.conversations`,
`browse.conversation` and `memory.forget_preview`, against a real `memd run`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess
from tests.support.ui import CLIENT, files_text, record

pytestmark = pytest.mark.slow
SETTINGS: dict[str, Any] = {"clients": {CLIENT: {"memory_enabled": True, "mode": "both"}}}


@pytest.fixture
def memd(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> DaemonProcess:
    return daemon_factory(config_file(**SETTINGS))


def _call_error(memd: DaemonProcess, method: str, params: dict[str, Any]) -> RemoteError:
    with pytest.raises(RemoteError) as info:
        memd.call(method, params)
    return info.value


def test_conversations_are_listed_newest_first_with_title_span_and_size(
    memd: DaemonProcess,
) -> None:
    record(memd, "alpha", "Where did I park the blue van?", "Level 3 of the garage.")
    record(memd, "alpha", "And the ticket?", "In the glovebox.")
    record(memd, "beta", "What is the wifi password at the cabin?", "It is pinecone77.")
    listing = memd.call("browse.conversations", {"client_id": CLIENT})
    [session] = listing["sessions"]
    assert session["state"] == "active" and not session["archived"] and not session["summary"]
    beta, alpha = session["conversations"]
    assert (beta["conversation_id"], alpha["conversation_id"]) == ("beta", "alpha")
    assert alpha["title"].startswith("Where did I park the blue van?")
    assert alpha["exchanges"] == 2 and beta["exchanges"] == 1
    assert alpha["first"] <= alpha["last"] <= beta["first"]
    said = ("Where did I park the blue van?", "Level 3 of the garage.", "And the ticket?")
    assert alpha["chars"] > sum(len(t) for t in said) and beta["chars"] > len(said[0])
    past = memd.call("browse.conversations", {"client_id": CLIENT, "before": "2001-01-01"})
    assert past["sessions"] == []
    recent = memd.call("browse.conversations", {"client_id": CLIENT, "after": "1h"})
    assert recent["sessions"] == listing["sessions"]


def test_a_conversation_is_read_a_page_and_a_window_at_a_time(memd: DaemonProcess) -> None:
    paste = "x" * 50_000 + "THE-END"
    for n in range(1, 6):
        record(memd, "long", f"question {n}", paste if n == 5 else f"answer {n}")
    conv_no = memd.call("browse.conversations", {"client_id": CLIENT})["sessions"][0][
        "conversations"
    ][0]["number"]
    sid = memd.call("browse.conversations", {"client_id": CLIENT})["sessions"][0]["session_id"]
    base = {"client_id": CLIENT, "session_id": sid, "conversation": conv_no}
    page = memd.call("browse.conversation", {**base, "offset": 2, "limit": 2})
    assert page["total"] == 5 and page["offset"] == 2
    assert [x["exchange"] for x in page["exchanges"]] == [3, 4]
    assert page["exchanges"][0]["parts"][0] == {
        "label": "User",
        "text": "question 3",
        "length": len("question 3"),
    }
    last = memd.call("browse.conversation", {**base, "around": 5, "limit": 2, "text_limit": 1000})
    assert last["offset"] == 4 and [x["exchange"] for x in last["exchanges"]] == [5]
    answer = last["exchanges"][0]["parts"][1]
    assert answer["length"] == len(paste) and answer["text"] == "x" * 1000
    tail = memd.call(
        "browse.conversation", {**base, "around": 5, "limit": 1, "text_offset": 50_000}
    )
    assert tail["exchanges"][0]["parts"][1]["text"] == "THE-END"


def test_bad_browse_requests_get_clear_errors(memd: DaemonProcess) -> None:
    record(memd, "c", "hello", "hi")
    assert _call_error(memd, "browse.conversations", {"client_id": "ghost"}).kind == (
        "unknown_client"
    )
    missing = {"client_id": CLIENT, "session_id": "2001-01-01T00-00-00Z-0000", "conversation": 1}
    assert _call_error(memd, "browse.conversation", missing).kind == "not_found"
    sid = memd.call("browse.conversations", {"client_id": CLIENT})["sessions"][0]["session_id"]
    base = {"client_id": CLIENT, "session_id": sid, "conversation": 1}
    assert _call_error(memd, "browse.conversation", {**base, "limit": 0}).code == -32602
    assert _call_error(memd, "browse.conversation", {**base, "around": 9}).kind == "not_found"
    two = {"client_id": CLIENT, "session_id": sid, "all": True}
    assert _call_error(memd, "memory.forget_preview", two).code == -32602
    assert memd.call("daemon.status")["state"] == "running"


def test_forget_preview_names_exactly_what_forget_removes_and_changes_nothing(
    memd: DaemonProcess, tmp_path: Path
) -> None:
    record(memd, "keep", "My locker number is 4410.", "Locker 4410, noted.")
    record(memd, "drop", "My old PIN was 7733.", "Noted: 7733.")
    record(memd, "drop", "And my alarm code is 9120.", "Noted: 9120.")
    listing = memd.call("browse.conversations", {"client_id": CLIENT})["sessions"][0]
    sid = listing["session_id"]
    before = files_text(tmp_path / "memory")
    shown = memd.call("memory.forget_preview", {"client_id": CLIENT, "conversation_id": "drop"})
    assert files_text(tmp_path / "memory") == before
    assert shown["counts"] == {"exchanges": 2, "sessions": 1, "summaries": 0}
    assert [(x["session_id"], x["exchange"]) for x in shown["exchanges"]] == [(sid, 1), (sid, 2)]
    assert all(x["title"].startswith("My old PIN was 7733.") for x in shown["exchanges"])
    again = memd.call(
        "memory.forget_preview",
        {
            "client_id": CLIENT,
            "session_id": sid,
            "conversation_id": shown["exchanges"][0]["conversation"],
        },
    )
    assert again["fingerprint"] == shown["fingerprint"]
    record(memd, "drop", "One more: the gate code is 5511.", "Noted: 5511.")
    grown = memd.call("memory.forget_preview", {"client_id": CLIENT, "conversation_id": "drop"})
    assert grown["fingerprint"] != shown["fingerprint"] and grown["counts"]["exchanges"] == 3
    with memd.client(timeout=300) as client:  # a forget waits for the index rebuild
        removed = client.call("memory.forget", {"client_id": CLIENT, "conversation_id": "drop"})
    assert removed["removed"]["exchanges"] == grown["counts"]["exchanges"]
    text = files_text(tmp_path / "memory")
    assert "7733" not in text and "5511" not in text and "4410" in text


def test_forget_preview_of_a_query_lists_what_recall_finds(memd: DaemonProcess) -> None:
    record(memd, "q1", "The spare house key is under the green flowerpot.", "Got it.")
    record(memd, "q2", "I take my coffee with oat milk.", "Noted.")
    params = {"client_id": CLIENT, "query": "where is the spare house key"}
    deadline = time.monotonic() + 90
    shown: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            shown = memd.call("memory.forget_preview", params)
        except RemoteError as exc:  # the index is still starting
            assert exc.kind == "index_unavailable", exc
            shown = {}
        if shown.get("exchanges"):
            break
        time.sleep(0.3)
    titles = [x["title"] for x in shown["exchanges"]]
    assert any("flowerpot" in t for t in titles), (shown, memd.log())
    hits = memd.call("memory.recall", params)["results"]
    assert len(shown["exchanges"]) <= len(hits)


def test_a_compacted_session_is_shown_as_archived_with_its_summary(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    from tests.support.fake_llm import FakeLLM

    with FakeLLM() as fake:
        compaction = {
            "enabled": True,
            "llm_provider": "openai",
            "llm_model": "fake",
            "base_url": fake.base_url,
        }
        memd = daemon_factory(config_file(**SETTINGS, compaction=compaction))
        sid = record(memd, "old", "FACT-archived: the boiler was serviced in May.", "Noted.")[
            "session_id"
        ]
        memd.call("sessions.close", {"client_id": CLIENT})
        root = tmp_path / "memory" / CLIENT
        deadline = time.monotonic() + 120
        while not (root / "archive" / f"{sid}.md").exists():
            assert time.monotonic() < deadline, memd.log()
            time.sleep(0.2)
        [session] = memd.call("browse.conversations", {"client_id": CLIENT})["sessions"]
        assert (session["session_id"], session["state"]) == (sid, "compacted")
        assert session["archived"] and session["summary"]
        conv = memd.call(
            "browse.conversation", {"client_id": CLIENT, "session_id": sid, "conversation": 1}
        )
        assert conv["archived"] and conv["state"] == "compacted"
        assert "FACT-archived" in conv["summary"]  # the fake LLM names what it was shown
        assert "FACT-archived" in conv["exchanges"][0]["parts"][0]["text"]
