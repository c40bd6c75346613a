"""`memory.export` / `memd export` and `memd import`: a client's memory taken elsewhere.

Through a real `memd run`: exchanges in an archived (compacted against the fake LLM) and
an active session, MCP and chat conversations, Unicode and markdown-looking text. Export
pages through them; `memd import` into a fresh client reproduces every exchange's text
and timestamp, and importing the same file again writes nothing twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import REPO, DaemonProcess, write_config
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

SRC, DST = "laptop", "newbox"
EXCHANGES = [
    ("plan", "Where is the spare key?", "Under the blue pot.", "2026-10-01T08:00:00Z"),
    (
        "plan",
        "# Not a heading\n**User:** not a marker",
        "Multi\nline ✓ Zürich 東京",
        "2026-10-01T08:05:30Z",
    ),
    ("trip", "Train at 7?", "Yes, platform 4.", "2026-10-02T09:00:00Z"),
]
LATER = [("later", "What is FACT-lentil?", "A legume.", "2026-11-20T10:00:00Z")]


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def settings(tmp: Path, fake: FakeLLM, **clients: Any) -> dict[str, Any]:
    return {
        "memory_dir": str(tmp / "memory"),
        "socket": str(tmp / "run" / "memd.sock"),
        "compaction": {
            "enabled": True,
            "llm_provider": "openai",
            "llm_model": "fake",
            "base_url": fake.base_url,
        },
        "clients": clients,
    }


def cli(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
        input=stdin,
        env={**os.environ, "HOME": str(config.parent / "home")},
    )


def record(memd: DaemonProcess, client: str, rows: list[tuple[str, str, str, str]]) -> str:
    sid = ""
    for conv, user, assistant, when in rows:
        sid = memd.call(
            "memory.record_exchange",
            {
                "client_id": client,
                "conversation_id": conv,
                "user": user,
                "assistant": assistant,
                "timestamp": when,
            },
        )["session_id"]
    return sid


def essence(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((r["time"], r["user"], r["assistant"]) for r in records)


def test_export_then_import_into_a_fresh_client_reproduces_every_exchange(
    tmp_path: Path, daemon_factory, fake: FakeLLM
) -> None:
    on = {"memory_enabled": True, "mode": "both"}
    config = write_config(tmp_path / "config.toml", settings(tmp_path, fake, **{SRC: on, DST: on}))
    memd = daemon_factory(config)
    first = record(memd, SRC, EXCHANGES)
    memd.call("sessions.close", {"client_id": SRC})
    root = tmp_path / "memory" / SRC
    deadline = time.monotonic() + 60
    while not (root / "archive" / f"{first}.md").exists():
        assert time.monotonic() < deadline, memd.log()
        time.sleep(0.1)
    record(memd, SRC, LATER)
    chat = [{"role": "user", "content": "Chat question?"}]
    memd.call(
        "memory.record_chat",
        {
            "client_id": SRC,
            "messages": chat,
            "response": {"role": "assistant", "content": "Chat answer."},
            "timestamp": "2026-11-21T10:00:00Z",
        },
    )

    out = cli(config, "export", SRC)
    assert out.returncode == 0, out.stderr
    exported = [json.loads(line) for line in out.stdout.splitlines()]
    expected = [(w, u, a) for _, u, a, w in EXCHANGES + LATER] + [
        ("2026-11-21T10:00:00Z", "Chat question?", "Chat answer.")
    ]
    assert essence(exported) == sorted(expected)
    by_user = {r["user"]: r for r in exported}
    assert by_user["Where is the spare key?"]["conversation_id"] == "plan"
    assert by_user["Where is the spare key?"]["session_id"] == first
    assert "conversation_id" not in by_user["Chat question?"]

    paged: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = memd.call(
            "memory.export",
            {"client_id": SRC, "limit": 2, **({"cursor": cursor} if cursor else {})},
        )
        assert len(page["exchanges"]) <= 2
        paged += page["exchanges"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == exported
    ranged = memd.call("memory.export", {"client_id": SRC, "after": "2026-11-01"})
    assert len(ranged["exchanges"]) == 2

    dump = tmp_path / "laptop.jsonl"
    dump.write_text(out.stdout, encoding="utf-8")
    imported = cli(config, "import", DST, str(dump))
    assert imported.returncode == 0, imported.stderr
    again = cli(config, "import", DST, str(dump), "--json")
    summary = json.loads(again.stdout)
    assert (summary["imported"], summary["already_there"], summary["failed"]) == (0, 5, 0)
    back = [json.loads(line) for line in cli(config, "export", DST).stdout.splitlines()]
    assert essence(back) == sorted(expected)
    assert {r["conversation_id"] for r in back} >= {"plan", "trip", "later"}

    markdown = cli(config, "export", SRC, "--format", "markdown")
    assert "**User:** Where is the spare key?" in markdown.stdout


def test_export_bad_input_and_a_disabled_client(
    tmp_path: Path, daemon_factory, fake: FakeLLM
) -> None:
    on = {"memory_enabled": True, "mode": "mcp_via_llm"}
    config = write_config(tmp_path / "config.toml", settings(tmp_path, fake, **{SRC: on}))
    memd = daemon_factory(config)
    record(memd, SRC, EXCHANGES[:1])
    with pytest.raises(RemoteError) as err:
        memd.call("memory.export", {"client_id": SRC, "cursor": "../../etc:1"})
    assert err.value.kind == "invalid_params"
    with pytest.raises(RemoteError) as err:
        memd.call("memory.export", {"client_id": "nobody"})
    assert err.value.kind == "unknown_client"
    assert memd.call("memory.export", {"client_id": SRC, "after": "2030-01-01"}) == {
        "exchanges": [],
        "next_cursor": None,
    }

    applied = memd.log().count("config.applied")
    write_config(config, settings(tmp_path, fake, **{SRC: {**on, "memory_enabled": False}}))
    deadline = time.monotonic() + 30
    while memd.log().count("config.applied") == applied:
        assert time.monotonic() < deadline, memd.log()
        time.sleep(0.1)
    [only] = memd.call("memory.export", {"client_id": SRC})["exchanges"]
    assert only["user"] == EXCHANGES[0][1]
    with memd.client(timeout=300) as client:  # waits for the index rebuild
        gone = client.call("memory.forget", {"client_id": SRC, "all": True})
    assert gone["removed"]["exchanges"] == 1
    assert memd.call("memory.export", {"client_id": SRC})["exchanges"] == []
    assert all("spare key" not in p.read_text() for p in (tmp_path / "memory" / SRC).rglob("*.md"))
