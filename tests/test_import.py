"""`memd import`: ChatGPT and Claude.ai data exports and memd's own JSON lines, end to end.

The exports are built in their published shapes (tests.support.exports): branches,
system, hidden and tool messages, images and attachments, Unicode, a conversation with
no messages, a truncated file. Each is imported into a real daemon through the CLI; the
tests check the summary's counts, the sessions and times memd wrote, that recall finds
a fact from an imported conversation, and that a second import writes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient, RemoteError
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config
from tests.support.exports import (
    ChatGPTConversation,
    claude_conversation,
    claude_message,
    write_json,
    write_zip,
)
from tests.support.faults import recall_finds, wait_for

pytestmark = pytest.mark.slow

ON = {"memory_enabled": True, "mode": "both"}


def cli(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        input=stdin,
        env={**os.environ, "HOME": str(config.parent / "home")},
    )


def call(memd: DaemonProcess, method: str, **params: Any) -> Any:
    with MemdClient(memd.socket, timeout=30) as client:
        return client.call(method, params)


def transcripts(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "sessions").glob("*.md"))}


def lisbon() -> ChatGPTConversation:
    """A branched conversation with every kind of message the export holds."""
    c = ChatGPTConversation("Lisbon trip ✈", "2024-03-05T09:00:00Z")
    c.say("system", [""], hidden=True)
    c.say("user", ["Be brief."], content_type="user_editable_context", hidden=True)
    ask = c.say("user", ["Where should we stay in Lisbon?"], "2024-03-05T09:00:10Z")
    c.say("assistant", ["Try Alfama."], "2024-03-05T09:00:20Z")  # the old branch
    c.say("user", ["And the food?"], "2024-03-05T09:01:00Z")
    c.say("assistant", ["Pastéis."], "2024-03-05T09:01:10Z")
    c.current = ask
    c.say(
        "assistant",
        ["Stay in Príncipe Real; the tram 28 stops near FACT-azulejo house."],
        "2024-03-05T09:00:30Z",
    )  # regenerated: the branch the user last saw
    c.say("user", ["Any museum? 東京 friends are coming"], "2024-03-06T10:00:00Z")
    c.say(
        "assistant",
        None,
        "2024-03-06T10:00:05Z",
        content_type="code",
        recipient="browser",
        extra={"language": "unknown", "text": "search('museum lisbon')"},
    )
    c.say(
        "tool",
        ["Results: Gulbenkian"],
        "2024-03-06T10:00:06Z",
        content_type="tether_browsing_display",
    )
    c.say("assistant", ["The Gulbenkian museum."], "2024-03-06T10:00:10Z")
    c.say(
        "user",
        [
            {
                "content_type": "image_asset_pointer",
                "asset_pointer": "file-service://x",
                "width": 10,
                "height": 10,
            },
            "What is in this photo?",
        ],
        "2024-03-06T11:00:00Z",
        content_type="multimodal_text",
        attachments=["tram.jpg"],
    )
    c.say("assistant", ["A yellow tram."], "2024-03-06T11:00:05Z")
    return c


def chatgpt_export() -> list[dict[str, Any]]:
    empty = ChatGPTConversation("Empty", "2024-02-01T00:00:00Z")
    empty.say("system", [""], hidden=True)
    unanswered = ChatGPTConversation("Unanswered", "2024-04-01T08:00:00Z")
    unanswered.say("user", ["Hello?"], "2024-04-01T08:00:00Z")
    return [lisbon().export(), empty.export(), unanswered.export()]


def test_a_chatgpt_export_keeps_its_branch_times_and_titles_and_imports_once(
    tmp_path: Path, daemon_factory
) -> None:
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, clients={"me": ON}))
    memd = daemon_factory(config)
    export = write_json(tmp_path / "conversations.json", chatgpt_export())

    first = cli(config, "import", "me", str(export), "--json")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["conversations"], summary["imported"], summary["already_there"]) == (2, 4, 0)
    skipped = summary["skipped"]
    assert skipped["conversation(s) with no messages"] == 1
    assert skipped["system message(s)"] == 2
    assert skipped["hidden message(s)"] == 1
    assert skipped["tool call(s) and output(s)"] == 2
    assert skipped["message(s) on other branches"] == 3

    rows = call(memd, "memory.export", client_id="me")["exchanges"]
    got = [(r["time"], r["user"], r["assistant"]) for r in rows]
    assert got == [
        (
            "2024-03-05T09:00:10Z",
            "Where should we stay in Lisbon?",
            "Stay in Príncipe Real; the tram 28 stops near FACT-azulejo house.",
        ),
        ("2024-03-06T10:00:00Z", "Any museum? 東京 friends are coming", "The Gulbenkian museum."),
        (
            "2024-03-06T11:00:00Z",
            "[image]\n\nWhat is in this photo?\n\n[attachment: tram.jpg]",
            "A yellow tram.",
        ),
        ("2024-04-01T08:00:00Z", "Hello?", ""),
    ]
    sessions = call(memd, "sessions.list", client_id="me")["sessions"]
    assert [(s["started"], s["state"], s["end_reason"]) for s in sessions] == [
        ("2024-03-05T09:00:10Z", "ended", "imported"),
        ("2024-04-01T08:00:00Z", "ended", "imported"),
    ]
    assert sessions[0]["ended"] == "2024-03-06T11:00:00Z"
    root = tmp_path / "memory" / "me"
    text = (root / "sessions" / f"{sessions[0]['session_id']}.md").read_text(encoding="utf-8")
    assert "# Conversation 1 (2024-03-05 09:00:10 UTC)" in text
    assert "Lisbon trip ✈" in text and "Alfama" not in text and "Pastéis" not in text
    assert wait_for(
        lambda: recall_finds(
            memd.socket, "me", "where to stay near the azulejo house", "FACT-azulejo"
        ),
        what="recall of an imported fact",
    )

    before = transcripts(root)
    again = cli(config, "import", "me", str(export), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["imported"] == 0
    assert json.loads(again.stdout)["already_there"] == 4
    assert transcripts(root) == before
    assert len(call(memd, "sessions.list", client_id="me")["sessions"]) == 2


def claude_export() -> list[dict[str, Any]]:
    talk = claude_conversation(
        "Sourdough 🍞",
        "2024-05-10T07:00:00.000000Z",
        [
            claude_message(
                "human",
                "My starter smells of acetone, FACT-levain?",
                "2024-05-10T07:00:00.123456Z",
                attachments=[
                    {
                        "file_name": "notes.txt",
                        "file_size": 12,
                        "file_type": "txt",
                        "extracted_content": "feed 1:1",
                    }
                ],
                files=[{"file_name": "jar.png"}],
            ),
            claude_message(
                "assistant",
                "",
                "2024-05-10T07:00:09Z",
                content=[
                    {"type": "thinking", "thinking": "hmm"},
                    {"type": "tool_use", "name": "web_search", "input": {"query": "acetone"}},
                    {"type": "tool_result", "name": "web_search", "content": []},
                    {"type": "text", "text": "Feed it more often: it is hungry. Größer jar helps."},
                ],
            ),
            claude_message("human", "How often?", "2024-05-11T08:00:00+02:00"),
            claude_message("assistant", "Twice a day.", "2024-05-11T06:00:05Z"),
        ],
    )
    empty = claude_conversation("", "2024-05-12T00:00:00Z", [])
    return [talk, empty]


def test_a_claude_zip_export_with_attachments_and_tools_imports_once(
    tmp_path: Path, daemon_factory
) -> None:
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, clients={"me": ON}))
    memd = daemon_factory(config)
    export = write_zip(tmp_path / "data-2024.zip", claude_export(), "conversations.json")

    first = cli(config, "import", "me", str(export))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("imported 2 exchange(s) in 1 conversation(s), 0 already")
    assert "1 conversation(s) with no messages" in first.stdout
    rows = call(memd, "memory.export", client_id="me")["exchanges"]
    assert [(r["time"], r["user"], r["assistant"]) for r in rows] == [
        (
            "2024-05-10T07:00:00Z",
            "My starter smells of acetone, FACT-levain?\n\n[attachment: notes.txt]\n\n"
            "[file: jar.png]",
            "[tool: web_search]\n\nFeed it more often: it is hungry. Größer jar helps.",
        ),
        ("2024-05-11T06:00:00Z", "How often?", "Twice a day."),
    ]
    sessions = call(memd, "sessions.list", client_id="me")["sessions"]
    assert [s["started"] for s in sessions] == ["2024-05-10T07:00:00Z"]
    root = tmp_path / "memory" / "me"
    before = transcripts(root)
    forced = cli(config, "import", "me", str(export), "--format", "claude", "--json")
    assert json.loads(forced.stdout)["already_there"] == 2
    assert transcripts(root) == before
    wrong = cli(config, "import", "me", str(export), "--format", "chatgpt")
    assert wrong.returncode == 1 and "conversation 1: no `mapping`" in wrong.stderr


def test_a_truncated_export_names_the_place_and_a_rerun_finishes_it(
    tmp_path: Path, daemon_factory
) -> None:
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, clients={"me": ON}))
    memd = daemon_factory(config)
    convs = [ChatGPTConversation(f"Note {i}", f"2024-06-0{i}T10:00:00Z") for i in range(1, 6)]
    for i, c in enumerate(convs, 1):
        c.say("user", [f"Remember number {i}"], f"2024-06-0{i}T10:00:00Z")
        c.say("assistant", [f"Noted {i}."], f"2024-06-0{i}T10:00:01Z")
    full = json.dumps([c.export() for c in convs])
    cut = full[: full.index('"Note 4"') + 20]  # inside the 4th conversation
    (tmp_path / "cut.json").write_text(cut, encoding="utf-8")

    broken = cli(config, "import", "me", str(tmp_path / "cut.json"), "--json")
    assert broken.returncode == 1
    assert "cut.json: malformed JSON near byte" in broken.stderr
    assert "after conversation 3" in broken.stderr
    assert json.loads(broken.stdout)["imported"] == 3
    (tmp_path / "full.json").write_text(full, encoding="utf-8")
    rerun = cli(config, "import", "me", str(tmp_path / "full.json"), "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert (json.loads(rerun.stdout)["imported"], json.loads(rerun.stdout)["already_there"]) == (
        2,
        3,
    )
    assert len(call(memd, "memory.export", client_id="me")["exchanges"]) == 5


def test_reimporting_a_clients_own_export_writes_nothing_and_a_new_client_keeps_its_sessions(
    tmp_path: Path, daemon_factory
) -> None:
    config = write_config(
        tmp_path / "config.toml", base_config(tmp_path, clients={"src": ON, "dst": ON})
    )
    memd = daemon_factory(config)
    for conv, user, when in [
        ("plan", "Spare key?", "2025-01-02T08:00:00Z"),
        ("plan", "And the bike?", "2025-01-02T08:05:00Z"),
    ]:
        call(
            memd,
            "memory.record_exchange",
            client_id="src",
            conversation_id=conv,
            user=user,
            assistant="In the shed.",
            timestamp=when,
        )
    call(memd, "sessions.close", client_id="src")
    call(
        memd,
        "memory.record_chat",
        client_id="src",
        messages=[{"role": "user", "content": "Chat?"}],
        response={"role": "assistant", "content": "Yes."},
        timestamp="2025-01-05T09:00:00Z",
    )
    dump = tmp_path / "src.jsonl"
    dump.write_text(cli(config, "export", "src").stdout, encoding="utf-8")
    source = call(memd, "sessions.list", client_id="src")["sessions"]

    root = tmp_path / "memory" / "src"
    before = transcripts(root)
    own = cli(config, "import", "src", str(dump), "--json")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["imported"] == 0
    assert json.loads(own.stdout)["already_there"] == 3
    assert transcripts(root) == before

    elsewhere = cli(config, "import", "dst", str(dump), "--json")
    assert json.loads(elsewhere.stdout)["imported"] == 3
    copied = call(memd, "sessions.list", client_id="dst")["sessions"]
    assert sorted((s["session_id"], s["started"]) for s in copied) == sorted(
        (s["session_id"], s["started"]) for s in source
    )  # two sessions may start in the same second: listed in either order
    assert all(s["state"] == "ended" for s in copied)
    back = [json.loads(line) for line in cli(config, "export", "dst").stdout.splitlines()]
    assert [(r["session_id"], r["time"], r["user"]) for r in back] == [
        (r["session_id"], r["time"], r["user"])
        for r in map(json.loads, dump.read_text(encoding="utf-8").splitlines())
    ]
    again = cli(config, "import", "dst", str(dump), "--json")
    assert json.loads(again.stdout)["already_there"] == 3


def test_bad_files_are_clear_errors_with_exit_2(tmp_path: Path, daemon_factory) -> None:
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, clients={"me": ON}))
    memd = daemon_factory(config)
    missing = cli(config, "import", "me", str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("memd: cannot read ") and "Traceback" not in missing.stderr
    folder = cli(config, "import", "me", str(tmp_path))
    assert folder.returncode == 2 and "Traceback" not in folder.stderr
    (tmp_path / "notes.txt").write_text("hello\n", encoding="utf-8")
    text = cli(config, "import", "me", str(tmp_path / "notes.txt"))
    assert text.returncode == 2 and "not a ChatGPT or Claude export" in text.stderr
    write_zip(tmp_path / "other.zip", [], "something.json")
    other = cli(config, "import", "me", str(tmp_path / "other.zip"))
    assert other.returncode == 2 and "without conversations.json" in other.stderr
    bad_line = cli(config, "import", "me", "-", stdin='{"session_id": 1}\n')
    assert bad_line.returncode == 1 and "line 1: not an exported exchange" in bad_line.stderr
    item = {"user": "u", "assistant": "a", "exchange_id": "x"}
    for params, param in [
        ({"exchanges": [item]}, "exchanges[0].timestamp"),
        ({"exchanges": [{**item, "timestamp": "2024-01-01", "colour": 1}]}, "exchanges[0].colour"),
        ({"exchanges": []}, "exchanges"),
        ({"exchanges": [{**item, "timestamp": "2024-01-01"}], "session_id": "../x"}, "session_id"),
    ]:
        with pytest.raises(RemoteError) as err:
            call(memd, "memory.import_exchanges", client_id="me", conversation_id="c", **params)
        assert err.value.code == -32602 and err.value.data.get("param") == param
    assert call(memd, "memory.export", client_id="me")["exchanges"] == []
    assert call(memd, "daemon.status")["clients"]["me"]


def test_an_import_cut_short_by_ctrl_c_is_finished_by_running_it_again(
    tmp_path: Path, daemon_factory
) -> None:
    config = write_config(tmp_path / "config.toml", base_config(tmp_path, clients={"me": ON}))
    memd = daemon_factory(config)
    convs = []
    for i in range(1500):
        c = ChatGPTConversation(f"Chat {i}", "2024-07-01T10:00:00Z")
        c.say("user", [f"Question {i}"], "2024-07-01T10:00:00Z")
        c.say("assistant", [f"Answer {i}"], "2024-07-01T10:00:01Z")
        convs.append(c.export())
    export = write_json(tmp_path / "conversations.json", convs)
    cmd = [sys.executable, "-m", "memd.cli", "import", "me", str(export), "--json"]
    child = subprocess.Popen(
        [*cmd, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )
    wait_for(
        lambda: call(memd, "memory.export", client_id="me", limit=1)["exchanges"],
        what="the first exchange imported",
    )
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "interrupted: run the same command again" in err and "Traceback" not in err
    first = json.loads(out)["imported"]
    assert 0 < first < 1500

    rerun = cli(config, "import", "me", str(export), "--json")
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["imported"] + summary["already_there"] == 1500
    assert summary["already_there"] >= first
    users = []
    cursor = None
    while True:
        page = call(
            memd,
            "memory.export",
            client_id="me",
            limit=1000,
            **({"cursor": cursor} if cursor else {}),
        )
        users += [r["user"] for r in page["exchanges"]]
        if not (cursor := page["next_cursor"]):
            break
    assert sorted(users) == sorted(f"Question {i}" for i in range(1500))
