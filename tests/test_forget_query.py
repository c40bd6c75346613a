"""`memd forget --query` acts only on what recall shows as relevant, and says what it removed.

Issue 24 items 1, 2 and 4, through a real `memd run` and the real command: a few personal
facts recorded as a new user would; forgetting "spare key" must remove the spare-key
exchange and nothing else (the peanut allergy recall ranks at 0.00 stays), print the
removed exchange's time and title even with `--yes`, and refuse a query nothing relevant
matches. Forgetting the first exchange of a conversation re-derives the title of what is
left; recording again to a forgotten conversation gets a real conversation number.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.slow

CLIENT = "demo"
DEADLINE = 90.0

FACTS = [
    ("keys", "I keep the spare key under the blue flowerpot by the back door.", "Noted."),
    ("food", "I am allergic to peanuts, so never suggest satay.", "Understood."),
    ("pet", "My cat is called Biscuit and she is nine years old.", "Lovely."),
    ("car", "My car is a green Skoda Octavia estate from 2014.", "Got it."),
    ("work", "I work as a hospital pharmacist on night shifts.", "Thanks."),
    ("city", "I moved to Leeds from Glasgow last spring.", "Welcome."),
]


def wait_for(predicate: Callable[[], Any], what: str, memd: DaemonProcess) -> Any:
    deadline = time.monotonic() + DEADLINE
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})\n{memd.log()}")


def record(memd: DaemonProcess, conv: str, user: str, reply: str) -> dict[str, Any]:
    return memd.call(
        "memory.record_exchange",
        {"client_id": CLIENT, "conversation_id": conv, "user": user, "assistant": reply},
    )


def recallable(memd: DaemonProcess, text: str) -> bool:
    try:
        out = memd.call("memory.recall", {"client_id": CLIENT, "query": text, "top_k": 20})
    except RemoteError as exc:
        if exc.kind != "index_unavailable":
            raise
        return False
    return any(text in r["content"] for r in out["results"])


def cli(memd: DaemonProcess, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "memd.cli", *args, "--config", str(memd.config_path)]
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def transcript(root: Path) -> str:
    return "".join(p.read_text() for p in sorted((root / "sessions").glob("*.md")))


def test_forget_query_takes_only_the_relevant_exchange(
    tmp_path: Path, config_file, daemon_factory
) -> None:
    memd = daemon_factory(config_file(clients={CLIENT: {"memory_enabled": True}}))
    root = tmp_path / "memory" / CLIENT
    for conv, user, reply in FACTS:
        record(memd, conv, user, reply)
    for _, user, _ in FACTS:
        wait_for(lambda user=user: recallable(memd, user), f"{user!r} recallable", memd)

    nothing = cli(memd, tmp_path, "forget", CLIENT, "--query", "quantum chromodynamics", "--yes")
    assert nothing.returncode == 1, nothing.stdout + nothing.stderr
    assert "nothing relevant" in nothing.stderr
    assert all(user in transcript(root) for _, user, _ in FACTS)

    # A dry run lists what a forget would take and changes nothing; an exact list
    # (what a preview showed) takes exactly that.
    with memd.client(timeout=300) as client:
        preview = client.call(
            "memory.forget", {"client_id": CLIENT, "query": "spare key", "dry_run": True}
        )
        assert [e["title"][:18] for e in preview["forgotten"]] == ["I keep the spare k"]
        assert preview["removed"]["exchanges"] == 0
        assert all(user in transcript(root) for _, user, _ in FACTS)
        pet = [
            {"session_id": preview["forgotten"][0]["session_id"], "conversation": 3, "exchange": 1}
        ]
        exact = client.call("memory.forget", {"client_id": CLIENT, "exchanges": pet})
    assert exact["removed"]["exchanges"] == 1
    assert [e["title"][:20] for e in exact["forgotten"]] == ["My cat is called Bis"]
    assert FACTS[2][1] not in transcript(root)

    done = cli(memd, tmp_path, "forget", CLIENT, "--query", "spare key", "--yes")
    assert done.returncode == 0, done.stderr
    assert "forgot 1 exchange" in done.stdout
    assert "spare key under the blue flowerpot" in done.stdout  # its title, with --yes too
    assert " · conversation 1 · exchange 1" in done.stdout  # and where and when it was
    left = transcript(root)
    assert "spare key" not in left
    for _, user, _ in (FACTS[1], *FACTS[3:]):
        assert user in left, f"forget --query removed an unrelated memory: {user!r}"


def test_forget_result_lists_exchanges_retitles_and_renumbers(
    tmp_path: Path, config_file, daemon_factory
) -> None:
    memd = daemon_factory(config_file(clients={CLIENT: {"memory_enabled": True}}))
    root = tmp_path / "memory" / CLIENT
    record(memd, "other", "remind me to water the tomatoes", "Will do.")
    record(memd, "bank", "my bank PIN is 9931, keep it safe", "I will not repeat it.")
    record(memd, "bank", "what time does the branch open on Saturday?", "At nine.")
    sid = record(memd, "bank", "and on Sunday?", "Closed.")["session_id"]
    with memd.client(timeout=300) as client:
        out = client.call(
            "memory.forget",
            {"client_id": CLIENT, "session_id": sid, "conversation_id": 2},
        )
    assert out["removed"]["exchanges"] == 3
    listed = out["forgotten"]
    assert [(e["conversation"], e["exchange"]) for e in listed] == [(2, 1), (2, 2), (2, 3)]
    assert all(e["session_id"] == sid and e["time"] for e in listed)
    assert listed[0]["title"].startswith("my bank PIN")

    # Item 4: recording to the forgotten conversation again starts a numbered one (the
    # forgotten one was the newest: its key was handed out again).
    again = record(memd, "bank", "is the branch open on holidays?", "No.")
    assert again["conversation"] == 3, again
    assert "# Conversation 3" in transcript(root)

    # Item 2: forgetting a conversation's first exchange re-titles what is left, in the
    # headings and in the rebuilt index.
    secret = "the safe code is 4417-secret"
    when = ("2026-10-01T10:00:00Z", "2026-10-01T11:00:00Z")
    for user, at in zip((secret, "where is the safe kept?"), when, strict=True):
        memd.call(
            "memory.record_exchange",
            {
                "client_id": CLIENT,
                "conversation_id": "safe",
                "timestamp": at,
                "user": user,
                "assistant": "Noted.",
            },
        )
    wait_for(lambda: recallable(memd, "where is the safe kept?"), "the safe recallable", memd)
    with memd.client(timeout=300) as client:
        cut = client.call(
            "memory.forget",
            {
                "client_id": CLIENT,
                "after": "2026-10-01T09:00:00Z",
                "before": "2026-10-01T10:30:00Z",
            },
        )
    assert cut["removed"]["exchanges"] == 1
    left = transcript(root)
    assert "where is the safe kept?" in left
    assert "4417" not in left, [ln for ln in left.splitlines() if "4417" in ln]
    wait_for(lambda: recallable(memd, "where is the safe kept?"), "the rest recallable", memd)
    held = [str(p) for p in root.rglob("*") if p.is_file() and b"4417" in p.read_bytes()]
    assert held == []
