"""Inputs at the edges get the right error (or are recorded), never silence or -32603.

Every request gets a reply; an id that cannot be echoed is answered with `id: null`;
input too deep or not valid Unicode is a -32602 naming the param or is recorded as text;
a disk-full error says so; a year before 1000 reads back; a client id cannot end in a
newline; a resumed conversation whose file was deleted keeps its `# Conversation` header.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.cli.client import MemdClient, RemoteError
from memd.config import ConfigError, parse_config
from memd.markdown.transcript import read_transcript as read_transcript_of
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config
from tests.support.faults import call, wait_for

CLIENTS = {
    "agent": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "gw": {"memory_enabled": True, "mode": "both"},
}


@pytest.fixture(scope="module")
def memd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the whole module: short sessions, so resume cases come quickly."""
    tmp = tmp_path_factory.mktemp("edge")
    path = write_config(
        tmp / "config.toml",
        base_config(
            tmp, clients=CLIENTS, session_inactivity_minutes=0.05, monitor_interval_seconds=0.3
        ),
    )
    proc = DaemonProcess(path).start()
    yield proc
    proc.end()


def _raw(memd: DaemonProcess, line: bytes) -> object:
    with MemdClient(memd.socket, timeout=30) as client:
        client.send_line(line)
        return json.loads(client.read_line())


def _exchange(conv: str, user: str = "u", **extra: object) -> dict:
    return {"client_id": "agent", "conversation_id": conv, "user": user, "assistant": "a", **extra}


# --- 9. ids that cannot be echoed ------------------------------------------------------------


def test_an_id_that_is_infinity_is_answered_with_null_id(memd: DaemonProcess) -> None:
    reply = _raw(memd, b'{"jsonrpc":"2.0","id":1e999,"method":"clients.list"}')
    assert reply["id"] is None and reply["error"]["code"] == -32600, reply


def test_a_batch_with_an_infinite_id_answers_every_request(memd: DaemonProcess) -> None:
    """The other entries of the batch are answered; the recorded one says it was recorded,
    so the caller does not retry it (and duplicate it)."""
    params = json.dumps(_exchange("batch-inf", "recorded once"))
    line = (
        f'[{{"jsonrpc":"2.0","id":1e999,"method":"clients.list"}},'
        f'{{"jsonrpc":"2.0","id":7,"method":"memory.record_exchange","params":{params}}}]'
    )
    reply = _raw(memd, line.encode())
    assert isinstance(reply, list) and len(reply) == 2, reply
    by_id = {r["id"]: r for r in reply}
    assert by_id[None]["error"]["code"] == -32600
    assert by_id[7]["result"]["conversation"] >= 1


# --- 11. deep nesting, lone surrogates -------------------------------------------------------


def test_deeply_nested_tool_call_arguments_are_recorded_as_text(memd: DaemonProcess) -> None:
    deep = "[" * 5000 + "]" * 5000
    messages = [
        {"role": "user", "content": "call the tool"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": deep}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
    ]
    try:
        result = call(
            memd.socket,
            "memory.record_chat",
            {
                "client_id": "gw",
                "messages": messages,
                "response": {"role": "assistant", "content": "done"},
            },
        )
    except RemoteError as exc:
        assert exc.code == -32602, exc
        assert "arguments" in json.dumps(exc.data), exc.data
        return
    assert result["appended"] == 4
    assert deep in Path(result["path"]).read_text()


@pytest.mark.parametrize("method", ["memory.recall", "memory.call_tool"])
def test_lone_surrogate_in_a_recall_query_is_invalid_params(
    memd: DaemonProcess, method: str
) -> None:
    if method == "memory.recall":
        params = '{"client_id":"agent","query":"tea \\ud800 time"}'
    else:
        params = (
            '{"client_id":"agent","name":"MemoryRecall","arguments":{"query":"tea \\ud800 time"}}'
        )
    reply = _raw(memd, f'{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}'.encode())
    if method == "memory.recall":
        assert reply["error"]["code"] == -32602, reply
        assert reply["error"]["data"]["param"] == "query", reply
    else:
        result = reply["result"]
        assert result["isError"] is True
        assert "query" in result["content"][0]["text"], result


# --- 13. timestamps, client ids, resumed conversations ---------------------------------------


def test_a_timestamp_before_year_1000_reads_back(memd: DaemonProcess) -> None:
    result = call(
        memd.socket,
        "memory.record_exchange",
        _exchange("ancient", "what did the monks write?", timestamp="0999-05-06T07:08:09Z"),
    )
    parsed = read_transcript_of(Path(result["path"]))
    times = [
        e.when
        for c in parsed.conversations
        if c.number == result["conversation"]
        for e in c.exchanges
    ]
    assert [t.year for t in times] == [999], times
    assert "## 0999-05-06 07:08:09 UTC" in Path(result["path"]).read_text()


def test_a_client_id_ending_in_a_newline_is_invalid(memd: DaemonProcess) -> None:
    with pytest.raises(RemoteError) as err:
        call(memd.socket, "memory.record_exchange", {**_exchange("nl"), "client_id": "agent\n"})
    assert err.value.kind == "invalid_id", err.value


def test_a_configured_client_id_ending_in_a_newline_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="clients"):
        parse_config({"clients": {"agent\n": {"memory_enabled": True}}})


def test_resumed_conversation_whose_file_was_deleted_keeps_its_header(memd: DaemonProcess) -> None:
    sock = memd.socket
    first = call(sock, "memory.record_exchange", _exchange("resume-deleted", "first words"))
    sid = first["session_id"]

    def ended() -> bool:
        rows = call(sock, "sessions.list", {"client_id": "agent"})["sessions"]
        return any(r["session_id"] == sid and r["state"] != "active" for r in rows)

    wait_for(ended, 60, 0.2, "the session ended")
    Path(first["path"]).unlink()
    second = call(sock, "memory.record_exchange", _exchange("resume-deleted", "more words"))
    assert second["session_id"] == sid
    text = Path(second["path"]).read_text()
    assert "# Conversation " in text, text
    parsed = read_transcript_of(Path(second["path"]))
    assert [c.number for c in parsed.conversations if c.exchanges] == [first["conversation"]]


# --- 10. the CLI with a broken config --------------------------------------------------------


def _memd_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(config.parent / "home")}
    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
        env=env,
    )


def test_cli_finds_the_running_daemon_while_the_config_is_invalid_toml(
    config_file, daemon_factory, tmp_path: Path
) -> None:
    path = config_file(clients=CLIENTS, socket=str(tmp_path / "elsewhere" / "memd.sock"))
    memd = daemon_factory(path)
    good = path.read_text()
    path.write_text(good + "\n[clients.broken\nmode = \n")
    wait_for(
        lambda: call(memd.socket, "daemon.status")["config_error"],
        30,
        0.1,
        "the broken edit rejected",
    )
    status = _memd_cli(path, "status")
    assert status.returncode == 0, status.stderr
    assert "rejected" in status.stdout and "TOML" in status.stdout, status.stdout
    record = _memd_cli(
        path, "record", "agent", "--conversation", "cli", "--user", "u", "--assistant", "a"
    )
    assert record.returncode == 0, record.stderr
    assert "recorded" in record.stdout


# --- 13. lock file, disk full ----------------------------------------------------------------


def test_a_symlinked_socket_lock_is_a_clear_error(config_file, tmp_path: Path) -> None:
    path = config_file(clients=CLIENTS)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "memd.sock.lock").symlink_to(tmp_path / "elsewhere.lock")
    memd = DaemonProcess(path).start(wait=False)
    assert memd.proc is not None
    code = memd.proc.wait(60)
    log = memd.log()
    assert code != 0
    assert "memd.sock.lock" in log and "symlink" in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]


def test_a_full_database_reports_disk_full_not_the_failed_rollback(tmp_path: Path) -> None:
    """sqlite ends the transaction itself on SQLITE_FULL; the error the caller sees must be
    "database or disk is full", not the ROLLBACK's "no transaction is active"."""
    from memd.layout import ClientLayout
    from memd.sessions.store import Change, StateStore

    store = StateStore(ClientLayout(tmp_path / "memory", "agent"))
    store.open()
    try:
        assert store.db is not None
        pages = store.db.execute("PRAGMA page_count").fetchone()[0]
        store.db.execute(f"PRAGMA max_page_count = {pages + 1}")
        nodes = [(os.urandom(16), 1, i, None) for i in range(5000)]
        with pytest.raises(Exception, match="full") as err:
            store.commit([Change(nodes=nodes)])
        assert "rollback" not in str(err.value).lower(), err.value
    finally:
        store.close()
