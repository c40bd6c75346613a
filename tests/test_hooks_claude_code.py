"""`memd hooks install|uninstall|run claude-code`: Claude Code's turns recorded by its hooks.

Settings are merged into a HOME of the test's own; the hook command is taken from the
settings file install wrote and run as Claude Code runs it (a shell, the hook's JSON on
stdin) against transcripts in Claude Code's JSON lines format built here: with memd
down (exit 0, nothing lost), then up, twice for the same turn, and for a resumed
session whose file carries the same entries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient
from tests.support.claude_code import Transcript
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config

ON = {"memory_enabled": True, "mode": "both"}
OTHER = {"type": "command", "command": "notify-send done"}


def memd_cli(home: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(cwd),
        env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)},
    )


def hook_commands(settings: Path, event: str) -> list[str]:
    data = json.loads(settings.read_text(encoding="utf-8"))
    return [h["command"] for g in data["hooks"].get(event, []) for h in g["hooks"]]


def run_hook(home: Path, command: str, payload: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """As Claude Code runs a command hook: through a shell, the payload on stdin."""
    return subprocess.run(
        command,
        shell=True,
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)},
    )


def test_install_merges_with_what_is_there_and_uninstall_takes_out_only_memd(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    original = {
        "permissions": {"allow": ["Bash(ls)"]},
        "hooks": {
            "Stop": [{"hooks": [OTHER]}],
            "PreToolUse": [{"matcher": "Bash", "hooks": [OTHER]}],
        },
    }
    settings.write_text(json.dumps(original), encoding="utf-8")

    first = memd_cli(home, "hooks", "install", "claude-code", "--client", "cc")
    assert first.returncode == 0, first.stderr
    data = json.loads(settings.read_text(encoding="utf-8"))
    assert data["permissions"] == original["permissions"]
    assert data["hooks"]["PreToolUse"] == original["hooks"]["PreToolUse"]
    for event in ("Stop", "SessionEnd"):
        ours = [c for c in hook_commands(settings, event) if "memd.cli.hook_run" in c]
        assert len(ours) == 1 and ours[0].endswith("--client cc")
    assert "notify-send done" in hook_commands(settings, "Stop")
    once = settings.read_bytes()
    again = memd_cli(home, "hooks", "install", "claude-code", "--client", "cc")
    assert again.returncode == 0 and "already" in again.stdout
    assert settings.read_bytes() == once

    out = memd_cli(home, "hooks", "uninstall", "claude-code")
    assert out.returncode == 0 and "removed 2" in out.stdout
    assert json.loads(settings.read_text(encoding="utf-8")) == original

    project = tmp_path / "project"
    project.mkdir()
    memd_cli(home, "hooks", "install", "claude-code", "--scope", "project", cwd=project)
    assert hook_commands(project / ".claude" / "settings.json", "Stop")
    assert json.loads(settings.read_text(encoding="utf-8")) == original

    settings.write_text("{not json", encoding="utf-8")
    broken = memd_cli(home, "hooks", "install", "claude-code")
    assert broken.returncode == 2 and "not valid JSON" in broken.stderr
    assert settings.read_text(encoding="utf-8") == "{not json"


def one_turn(t: Transcript, ask: str, answer: str, when: str) -> None:
    """A prompt, thinking, a tool call and its result, then the answer, as Claude Code logs."""
    t.add("user", ask, when)
    t.add("assistant", [{"type": "thinking", "thinking": "let me look", "signature": "x"}], when)
    call_id = "toolu_" + when[-6:-1].replace(":", "")
    t.add(
        "assistant",
        [{"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": "ls -1"}}],
        when,
    )
    t.add(
        "user",
        [{"type": "tool_result", "tool_use_id": call_id, "content": "a.py\nb.py"}],
        when,
        toolUseResult={"stdout": "a.py\nb.py"},
    )
    t.add("assistant", [{"type": "text", "text": answer}], when)


def exported(memd: DaemonProcess) -> list[dict[str, Any]]:
    with MemdClient(memd.socket) as client:
        return client.call("memory.export", {"client_id": "cc"})["exchanges"]


@pytest.mark.slow
def test_the_hook_records_each_turn_once_with_memd_down_then_up(
    tmp_path: Path, daemon_factory
) -> None:
    home = tmp_path / "home"
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, clients={"cc": ON}))
    install = memd_cli(
        home, "hooks", "install", "claude-code", "--client", "cc", "--config", str(config)
    )
    assert install.returncode == 0, install.stderr
    settings = home / ".claude" / "settings.json"
    [command] = hook_commands(settings, "Stop")
    assert hook_commands(settings, "SessionEnd") == [command]

    t = Transcript(tmp_path / "session.jsonl")
    t.write({"type": "summary", "summary": "Listing files", "leafUuid": "x"})
    t.write({"type": "file-history-snapshot", "messageId": "m", "snapshot": {}})
    one_turn(
        t, "Which files are here? FACT-kumquat", "Two: a.py and b.py.", "2026-03-01T10:00:00.000Z"
    )
    t.add("user", "Caveat: local command output", "2026-03-01T10:00:01.000Z", isMeta=True)
    side = {
        "type": "user",
        "isSidechain": True,
        "uuid": "side-1",
        "message": {"role": "user", "content": "subagent prompt"},
        "timestamp": "2026-03-01T10:00:02Z",
    }
    t.write(side)

    down = run_hook(home, command, t.payload())
    assert down.returncode == 0
    assert "the next turn retries" in down.stderr

    memd = daemon_factory(config)
    t.add(
        "user",
        [
            {"type": "text", "text": "Und die Größe? 🙂"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            },
        ],
        "2026-03-01T10:05:00.000Z",
    )
    t.add("assistant", [{"type": "text", "text": "Both are tiny."}], "2026-03-01T10:05:03.000Z")
    up = run_hook(home, command, t.payload())
    assert up.returncode == 0, up.stderr
    rows = exported(memd)
    assert [(r["time"], r["user"], r["assistant"]) for r in rows] == [
        (
            "2026-03-01T10:00:00Z",
            "Which files are here? FACT-kumquat",
            'Tool call (Bash): {"command": "ls -1"}\n\nTwo: a.py and b.py.',
        ),
        ("2026-03-01T10:05:00Z", "Und die Größe? 🙂\n\n[image]", "Both are tiny."),
    ]
    assert len({r["conversation"] for r in rows}) == 1

    files = sorted((tmp_path / "memory" / "cc" / "sessions").glob("*.md"))
    before = {p: p.read_bytes() for p in files}
    twice = run_hook(home, command, t.payload("SessionEnd"))
    assert twice.returncode == 0 and twice.stderr == ""
    for cursor in (home / ".local" / "state" / "memd" / "claude-code").glob("*.json"):
        cursor.unlink()  # without its cursor the hook resends every turn: memd drops them
    assert run_hook(home, command, t.payload()).returncode == 0
    assert {p: p.read_bytes() for p in files} == before

    resumed = Transcript(tmp_path / "resumed.jsonl")
    resumed.path.write_bytes(t.path.read_bytes())  # a resumed session carries the entries
    resumed.parent = t.parent
    one_turn(resumed, "And now?", "Still two.", "2026-03-02T09:00:00.000Z")
    assert run_hook(home, command, resumed.payload()).returncode == 0
    rows = exported(memd)
    assert [r["user"] for r in rows][-1] == "And now?" and len(rows) == 3
    assert len({(r["session_id"], r["conversation"]) for r in rows}) == 1

    # A turn read back with other text (read while it was still being written): memd
    # keeps what it has, and the turns after it are still recorded.
    changed = Transcript(tmp_path / "changed.jsonl")
    text = t.path.read_text(encoding="utf-8").replace("Two: a.py and b.py.", "Three.")
    changed.path.write_text(text, encoding="utf-8")
    changed.parent = t.parent
    changed.add("user", "Last one?", "2026-03-03T09:00:00.000Z")
    changed.add("assistant", [{"type": "text", "text": "Yes."}], "2026-03-03T09:00:01.000Z")
    assert run_hook(home, command, changed.payload()).returncode == 0
    rows = exported(memd)
    assert [r["user"] for r in rows][-1] == "Last one?" and len(rows) == 4
    assert rows[0]["assistant"].endswith("Two: a.py and b.py.")


def test_a_hook_without_a_usable_payload_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for stdin in ("", "not json", json.dumps({"transcript_path": str(tmp_path / "none")})):
        out = subprocess.run(
            [sys.executable, "-m", "memd.cli", "hooks", "run", "claude-code"],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(REPO),
            env={**os.environ, "HOME": str(home)},
        )
        assert out.returncode == 0 and "Traceback" not in out.stderr
