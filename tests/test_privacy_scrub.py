"""Secrets never reach the disk: scrubbing on record, through a real `memd run` (issue #26).

A generated corpus of real-shaped secrets (tests/secret_corpus.py) embedded in prose,
code blocks, JSON and URLs is recorded over the socket by an `mcp_via_llm` client and a
`both` client (in messages, replies and tool-call arguments), and imported with `memd
import`. Then no file under the
memory folder (transcripts, `.memd/` databases and their `-wal`, the index's files) nor
memd's log holds any of them; recall and export show the markers; the result and
`daemon.status` count them; and a `both` request that resends the original text with its
secrets is still recognised as the same conversation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import RemoteError
from tests.secret_corpus import embed, secrets
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.slow

CLIENTS = {
    "agent": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "gw": {"memory_enabled": True, "mode": "both"},
}
PRIVATE = "my-diary-entry-about-the-orchard-4711"


def traces(root: Path, needles: list[str]) -> list[str]:
    """Every file under `root` holding one of `needles` (what `grep -r` would list)."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {n[:24]}" for n in needles if n.encode() in data]
    return hits


def recall_text(memd: DaemonProcess, client: str, query: str) -> str:
    try:
        out = memd.call("memory.recall", {"client_id": client, "query": query, "top_k": 20})
    except RemoteError as exc:
        if exc.kind != "index_unavailable":
            raise
        return ""
    return "\n".join(r["content"] for r in out["results"])


def wait_for(predicate: Any, what: str, memd: DaemonProcess, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{memd.log()[-3000:]}")


def chat_call(messages: list[dict[str, Any]], response: dict[str, Any]) -> dict[str, Any]:
    return {"client_id": "gw", "messages": messages, "response": response}


def test_secrets_recorded_over_the_socket_never_reach_the_disk(
    tmp_path: Path, config_file, daemon_factory
) -> None:
    cfg = config_file(clients=CLIENTS)
    memd = daemon_factory(cfg)
    corpus = secrets(seed=3)
    values = [value for _kind, value, _written in corpus]
    total = 0
    for i, (kind, _value, written) in enumerate(corpus):
        out = memd.call(
            "memory.record_exchange",
            {
                "client_id": "agent",
                "conversation_id": f"c{i % 3}",
                "user": f"orchard setup step {i}: " + embed(kind, written, i),
                "assistant": f"Noted for the orchard ({kind}); I will not repeat {written}.",
            },
        )
        assert out["redacted"] >= 2, (kind, out)
        total += out["redacted"]

    key = corpus[0][2]
    pem = next(w for k, _v, w in corpus if k == "private-key")
    history = [
        {"role": "system", "content": "You are the orchard helper."},
        {"role": "user", "content": f"orchard deploy uses {key}\n```json\n{embed('x', pem, 2)}```"},
    ]
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "deploy", "arguments": {"token": corpus[5][2], "n": 1}},
            }
        ],
    }
    first = memd.call("memory.record_chat", chat_call(history, reply))
    assert first["new_conversation"] and first["redacted"] == 3, first
    # The app resends everything as it was, secrets included, plus a new turn.
    again = [
        *history,
        reply,
        {"role": "tool", "tool_call_id": "call_1", "content": "deployed"},
        {"role": "user", "content": f"orchard note <private>{PRIVATE}</private> done"},
    ]
    second = memd.call(
        "memory.record_chat", chat_call(again, {"role": "assistant", "content": "ok"})
    )
    assert second["match"] == "continuation", second
    assert second["conversation"] == first["conversation"]
    assert second["redacted"] == 1  # the private span; nothing resent counts again

    agent_text = wait_for(
        lambda: (t := recall_text(memd, "agent", "orchard setup step")) and "[redacted:" in t and t,
        "recall of the agent's markers",
        memd,
    )
    assert not any(v in agent_text for v in values)
    gw_text = wait_for(
        lambda: "[private]" in (t := recall_text(memd, "gw", "orchard note done")) and t,
        "recall of the private marker",
        memd,
    )
    assert PRIVATE not in gw_text
    page = memd.call("memory.export", {"client_id": "agent"})
    exported = str(page["exchanges"])
    assert "[redacted: github-token]" in exported and not any(v in exported for v in values)

    # `memd import` of an export holding secrets (another app's, or an older memd's).
    lines = [
        {
            "session_id": "2026-01-01T00-00-00Z-0000",
            "conversation": 1,
            "conversation_id": "imported",
            "exchange": i + 1,
            "time": f"2026-01-01T00:0{i}:00Z",
            "user": f"imported orchard note {i}: {written}",
            "assistant": "ok",
        }
        for i, (_k, _v, written) in enumerate(corpus[:5])
    ]
    dump = tmp_path / "export.jsonl"
    dump.write_text("".join(json.dumps(line) + "\n" for line in lines))
    imported = subprocess.run(
        [sys.executable, "-m", "memd.cli", "import", "agent", str(dump), "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    total += 5
    shown = subprocess.run(
        [sys.executable, "-m", "memd.cli", "status", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "REDACTED" in shown and f"{total:,}" in shown

    status = memd.call("daemon.status")["clients"]
    assert sum(status["agent"]["redacted"].values()) == total
    assert status["gw"]["redacted"]["private"] == 1
    assert not any(v in str(status) for v in values)

    memory = tmp_path / "memory"
    needles = [*values, PRIVATE]
    assert list(memory.rglob("*-wal")), "the databases should be in WAL mode"
    assert traces(memory, needles) == []
    assert not any(n in memd.log() for n in needles)
