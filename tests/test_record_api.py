"""Recording through the real daemon: the opt-in gate, bad input, crash safety, the monitor."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from memd.cli.client import MemdClient, RemoteError
from memd.markdown.transcript import read_transcript

CLIENTS = {
    "gw": {"memory_enabled": True, "mode": "both"},
    "agent": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "unset": {"mode": "both"},
    "off": {"memory_enabled": False, "mode": "both"},
    "router": {"memory_enabled": True, "mode": "llm_only"},
    "tools": {"memory_enabled": True, "mode": "mcp_only"},
}


def exchange(client: str, conv: str = "c1", user: str = "hello", assistant: str = "hi") -> dict:
    return {"client_id": client, "conversation_id": conv, "user": user, "assistant": assistant}


@pytest.mark.parametrize(
    ("client_id", "code", "kind"),
    [
        ("nobody", -32001, "unknown_client"),
        ("unset", -32002, "memory_disabled"),
        ("off", -32002, "memory_disabled"),
        ("router", -32003, "unsupported_mode"),
        ("tools", -32003, "unsupported_mode"),
        ("../gw", -32004, "invalid_id"),
        ("gw/../../etc", -32004, "invalid_id"),
    ],
)
def test_refused_clients_get_distinct_errors_and_nothing_is_written(
    module_daemon, client_id, code, kind
) -> None:
    memd, tmp_path = module_daemon(clients=CLIENTS)
    before = sorted((tmp_path / "memory").rglob("*.md"))
    with pytest.raises(RemoteError) as err:
        memd.call("memory.record_exchange", exchange(client_id))
    assert (err.value.code, err.value.kind) == (code, kind)
    with pytest.raises(RemoteError) as err:
        memd.call(
            "memory.record_chat",
            {
                "client_id": client_id,
                "messages": [{"role": "user", "content": "x"}],
                "response": {"role": "assistant", "content": "y"},
            },
        )
    assert err.value.code == code
    assert sorted((tmp_path / "memory").rglob("*.md")) == before


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"conversation_id": "c", "user": "u", "assistant": "a"}, "client_id"),
        (
            {"client_id": "agent", "conversation_id": 5, "user": "u", "assistant": "a"},
            "conversation_id",
        ),
        ({"client_id": "agent", "conversation_id": "c", "user": ["u"], "assistant": "a"}, "user"),
        (
            {"client_id": "agent", "conversation_id": "c", "user": "u", "assistant": None},
            "assistant",
        ),
        (
            {
                "client_id": "agent",
                "conversation_id": "c",
                "user": "u",
                "assistant": "a",
                "timestamp": "yesterday",
            },
            "timestamp",
        ),
        (
            {
                "client_id": "agent",
                "conversation_id": "c",
                "user": "u",
                "assistant": "a",
                "extra": 1,
            },
            "extra",
        ),
    ],
)
def test_bad_record_params_are_invalid_params(module_daemon, params, param) -> None:
    memd, _ = module_daemon(clients=CLIENTS)
    with pytest.raises(RemoteError) as err:
        memd.call("memory.record_exchange", params)
    assert err.value.code == -32602
    assert param in err.value.message
    after = memd.call("memory.record_exchange", exchange("agent", conv=f"after-{param}"))
    assert after["duplicate"] is False
    assert "hello" in Path(after["path"]).read_text()


def test_bad_chat_shapes_are_invalid_params(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    bad = [
        {"messages": [], "response": {"role": "assistant", "content": "x"}},
        {
            "messages": [{"role": "wizard", "content": "x"}],
            "response": {"role": "assistant", "content": "x"},
        },
        {
            "messages": [{"role": "user", "content": 3}],
            "response": {"role": "assistant", "content": "x"},
        },
        {"messages": [{"role": "user", "content": "x"}], "response": {"role": "user"}},
        {"messages": "hello", "response": {"role": "assistant", "content": "x"}},
    ]
    for body in bad:
        with pytest.raises(RemoteError) as err:
            memd.call("memory.record_chat", {"client_id": "gw", **body})
        assert err.value.code == -32602, body


def test_chat_continuation_and_session_file(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Name a blue fruit"},
    ]
    reply = {"role": "assistant", "content": "Blueberry"}
    first = memd.call(
        "memory.record_chat", {"client_id": "gw", "messages": msgs, "response": reply}
    )
    assert first["new_conversation"] is True
    msgs2 = [*msgs, reply, {"role": "user", "content": "And a red one?"}]
    second = memd.call(
        "memory.record_chat",
        {
            "client_id": "gw",
            "messages": msgs2,
            "response": {"role": "assistant", "content": "Cherry"},
        },
    )
    assert second["new_conversation"] is False
    assert second["conversation"] == first["conversation"]
    assert second["appended"] == 2
    text = Path(first["path"]).read_text()
    assert text.count("Blueberry") == 1 and "Cherry" in text
    listed = memd.call("sessions.list", {"client_id": "gw"})["sessions"]
    assert [s["session_id"] for s in listed] == [first["session_id"]]
    assert listed[0]["state"] == "active"


def _flood(sock_path: Path, n: int, acked: list[str], prefix: str) -> None:
    """Pipeline n records on one connection; note each acknowledged one."""
    try:
        with MemdClient(sock_path, timeout=30) as client:
            lines = []
            for i in range(n):
                req = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "memory.record_exchange",
                    "params": exchange(
                        "agent", conv=f"{prefix}", user=f"{prefix}-u{i}", assistant=f"{prefix}-a{i}"
                    ),
                }
                lines.append(json.dumps(req).encode())
            client.send_line(b"\n".join(lines))
            for _ in range(n):
                reply = json.loads(client.read_line())
                if "result" in reply:
                    acked.append(f"{prefix}-u{reply['id']}")
    except Exception:  # the daemon was killed mid-way
        return


def test_sigkill_mid_flood_loses_and_duplicates_nothing(config_file, daemon_factory) -> None:
    path = config_file(clients=CLIENTS)
    memd = daemon_factory(path)
    acked: list[str] = []
    threads = [
        threading.Thread(target=_flood, args=(memd.socket, 125, acked, f"t{k}")) for k in range(8)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(acked) < 200 and time.monotonic() < deadline:
        time.sleep(0.002)
    memd.kill(signal.SIGKILL)
    for t in threads:
        t.join(30)
    memd.proc.wait(10)
    assert 200 <= len(acked) < 1000, len(acked)

    again = daemon_factory(path)
    sessions = again.call("sessions.list", {"client_id": "agent"})["sessions"]
    assert len(sessions) == 1
    text = Path(sessions[0]["path"]).read_text()
    users = [
        p.text
        for c in read_transcript(Path(sessions[0]["path"])).conversations
        for e in c.exchanges
        for p in e.parts
        if p.label == "User"
    ]
    for tag in acked:
        assert users.count(tag) == 1, tag
    assert len(users) == len(set(users))  # nothing duplicated, acked or not
    # The same session and conversation go on after the restart.
    result = again.call("memory.record_exchange", exchange("agent", conv="t0", user="after"))
    assert result["session_id"] == sessions[0]["session_id"]
    assert result["path"] == sessions[0]["path"]
    before = [c for c in read_transcript(Path(result["path"])).conversations]
    assert (
        sum(1 for c in before if any(p.text == "after" for e in c.exchanges for p in e.parts)) == 1
    )
    assert text in Path(result["path"]).read_text()


def test_monitor_ends_sessions_by_inactivity(config_file, daemon_factory) -> None:
    memd = daemon_factory(
        config_file(clients=CLIENTS, session_inactivity_minutes=0.02, monitor_interval_seconds=0.2)
    )
    first = memd.call("memory.record_exchange", exchange("agent"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = memd.call("sessions.list", {"client_id": "agent"})["sessions"][0]
        if state["state"] == "ended":
            break
        time.sleep(0.1)
    assert state["state"] == "ended" and state["end_reason"] == "inactivity"
    second = memd.call("memory.record_exchange", exchange("agent", conv="c2"))
    assert second["session_id"] != first["session_id"]


def test_monitor_ends_sessions_by_max_duration_even_when_busy(config_file, daemon_factory) -> None:
    memd = daemon_factory(
        config_file(
            clients=CLIENTS,
            session_inactivity_minutes=10,
            max_session_minutes=0.03,
            monitor_interval_seconds=0.2,
        )
    )
    first = memd.call("memory.record_exchange", exchange("agent"))["session_id"]
    deadline = time.monotonic() + 20
    ids = {first}
    calls = 0
    while time.monotonic() < deadline and len(ids) == 1:
        calls += 1
        ids.add(
            memd.call("memory.record_exchange", exchange("agent", conv=f"busy-{calls}"))[
                "session_id"
            ]
        )
        time.sleep(0.2)
    assert len(ids) == 2
    ended = next(
        s
        for s in memd.call("sessions.list", {"client_id": "agent"})["sessions"]
        if s["session_id"] == first
    )
    assert ended["end_reason"] == "max_duration"


def test_restart_keeps_session_and_monitor_ends_it_on_time(config_file, daemon_factory) -> None:
    path = config_file(
        clients=CLIENTS, session_inactivity_minutes=0.05, monitor_interval_seconds=0.2
    )
    memd = daemon_factory(path)
    first = memd.call("memory.record_exchange", exchange("agent"))
    memd.kill(signal.SIGKILL)
    memd.proc.wait(10)
    again = daemon_factory(path)
    assert (
        again.call("memory.record_exchange", exchange("agent"))["session_id"] == first["session_id"]
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        sessions = again.call("sessions.list", {"client_id": "agent"})["sessions"]
        if sessions[0]["state"] == "ended":
            break
        time.sleep(0.1)
    assert sessions[0]["state"] == "ended"


def test_disabling_a_client_refuses_records_and_keeps_files(
    config_file, daemon_factory, tmp_path
) -> None:
    from tests.support.daemon import base_config, write_config

    path = config_file(clients=CLIENTS)
    memd = daemon_factory(path)
    rec = memd.call("memory.record_exchange", exchange("agent", user="keep me"))
    clients = {**CLIENTS, "agent": {"memory_enabled": False, "mode": "mcp_via_llm"}}
    write_config(path, base_config(tmp_path, clients=clients))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            memd.call("memory.record_exchange", exchange("agent"))
        except RemoteError as exc:
            assert exc.kind == "memory_disabled"
            break
        time.sleep(0.1)
    else:
        raise AssertionError("client was not disabled")
    assert "keep me" in Path(rec["path"]).read_text()


def test_garbage_on_the_socket_leaves_recording_intact(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(str(memd.socket))
        raw.sendall(b"\xff\xfe{not json\n" + b"[" * 100000 + b"\n")
        raw.settimeout(10)
        assert b"-32700" in raw.recv(65536)
    assert memd.call("memory.record_exchange", exchange("agent"))["conversation"] == 1
