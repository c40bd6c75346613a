"""Watchers on demand in the real daemon (issue 29): an idle client's `memsearch watch` is
stopped (IDLE in status, no process) and started again by the first change to its
sessions/, a record through memd or a file written by hand, with nothing missed from the
index; also a change while the watcher stops, a memd restart while clients are idle, and
kill -9 of the zygote while a watcher is being started on demand. Real memsearch, real
Milvus Lite, the embedded model; the idle time is configured short (seconds)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import (
    call,
    child_status,
    children_by_client,
    processes_mentioning,
    recall_finds,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults]

CLIENTS = {
    "ann": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "bea": {"memory_enabled": True, "mode": "mcp_via_llm"},
}
IDLE_MINUTES = 0.05  # 3 s


def _state(sock: Path, client: str, name: str = "watcher") -> str | None:
    return child_status(sock, client, name).get("state")


def _idle(sock: Path, client: str) -> bool:
    return _state(sock, client) == "IDLE" and _state(sock, client, "index_server") == "RUNNING"


def _record(sock: Path, client: str, user: str, assistant: str) -> None:
    call(
        sock,
        "memory.record_exchange",
        {"client_id": client, "conversation_id": "od", "user": user, "assistant": assistant},
    )


def _watchers(tmp_path: Path, memd_pid: int) -> dict[str, int]:
    procs = processes_mentioning(tmp_path / "memory", exclude=(memd_pid,))
    counts = children_by_client(procs, tmp_path / "memory", sorted(CLIENTS))
    return {client: c["watcher"] for client, c in counts.items()}


def _start(config_file: Any, daemon_factory: Any, minutes: float = IDLE_MINUTES) -> Any:
    memd = daemon_factory(
        config_file(clients=CLIENTS, supervision={"watcher_idle_minutes": minutes})
    )
    for client in CLIENTS:
        wait_for(lambda c=client: _idle(memd.socket, c), 180, 0.2, f"{client}'s watcher IDLE")
    return memd


def _recallable(sock: Path, client: str, query: str, needle: str, what: str) -> None:
    wait_for(lambda: recall_finds(sock, client, query, needle), 120, 0.3, what)


def test_idle_watcher_is_stopped_and_a_record_or_a_hand_edit_starts_it_with_nothing_missed(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = _start(config_file, daemon_factory)
    sock = memd.socket
    status = child_status(sock, "ann", "watcher")
    assert status["pid"] is None and status["retries"] == 0 and status["last_error"] is None
    assert _watchers(tmp_path, memd.proc.pid) == {"ann": 0, "bea": 0}
    # recall still answers from the index server while the watcher is IDLE
    call(sock, "memory.recall", {"client_id": "ann", "query": "anything", "top_k": 3})

    _record(sock, "ann", "Where is the kayak kept?", "The kayak is in boathouse Heron-31.")
    _recallable(sock, "ann", "kayak boathouse", "Heron-31", "the first record after idle")
    assert _state(sock, "bea") == "IDLE"  # the other client's watcher was left alone

    wait_for(lambda: _idle(sock, "ann"), 60, 0.2, "ann IDLE again")
    sessions = tmp_path / "memory" / "bea" / "sessions"
    (sessions / "by-hand.md").write_text("# Notes\n\nThe spare key hangs on hook Osprey-58.\n")
    wait_for(lambda: _state(sock, "bea") != "IDLE", 30, 0.1, "bea woken by a hand edit")
    _recallable(sock, "bea", "spare key hook", "Osprey-58", "a file written by hand")
    wait_for(lambda: _idle(sock, "bea"), 60, 0.2, "bea IDLE again")
    assert _watchers(tmp_path, memd.proc.pid) == {"ann": 0, "bea": 0}


def test_a_change_while_the_watcher_stops_starts_it_again_and_is_indexed(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = _start(config_file, daemon_factory, minutes=0.25)  # 15 s: time to freeze it
    sock = memd.socket
    _record(sock, "ann", "Which gate is the bus?", "The bus leaves from gate Tern-4.")
    wait_for(lambda: _state(sock, "ann") == "RUNNING", 120, 0.05, "ann woken")
    pid = child_status(sock, "ann", "watcher")["pid"]
    os.kill(pid, signal.SIGSTOP)  # its stop will hang until SIGCONT (or SIGKILL)
    try:
        wait_for(lambda: _state(sock, "ann") == "STOPPING", 60, 0.1, "ann parking")
        _record(sock, "ann", "Where is the red ladder?", "The red ladder is in shed Wren-77.")
        time.sleep(1.5)  # memd has seen the change while the old process still stops
        assert _state(sock, "ann") == "STOPPING"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(
        lambda: (
            _state(sock, "ann") == "RUNNING"
            and child_status(sock, "ann", "watcher")["pid"] not in (None, pid)
        ),
        120,
        0.1,
        "a new watcher after the old one stopped",
    )
    _recallable(sock, "ann", "red ladder shed", "Wren-77", "the change made while stopping")
    _recallable(sock, "ann", "bus gate", "Tern-4", "the change before")


def test_memd_restart_while_clients_are_idle_indexes_what_changed_meanwhile(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = _start(config_file, daemon_factory)
    memd.stop()
    sessions = tmp_path / "memory" / "ann" / "sessions"
    (sessions / "while-down.md").write_text("# Notes\n\nThe canoe paddle is in locker Gull-19.\n")
    again = _start(config_file, daemon_factory)  # both watchers scanned, then went IDLE
    _recallable(
        again.socket, "ann", "canoe paddle locker", "Gull-19", "written while memd was down"
    )
    assert _watchers(tmp_path, again.proc.pid) == {"ann": 0, "bea": 0}


def test_kill_9_of_the_zygote_while_a_watcher_starts_on_demand(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = _start(config_file, daemon_factory)
    sock = memd.socket
    zygote = call(sock, "daemon.status")["zygote"]["process"]["pid"]
    _record(sock, "bea", "What is the wifi name?", "The wifi is called Puffin-63.")
    wait_for(lambda: _state(sock, "bea") != "IDLE", 30, 0.02, "bea waking")
    os.kill(zygote, signal.SIGKILL)
    _recallable(sock, "bea", "wifi name", "Puffin-63", "the record that woke the watcher")
    wait_for(
        lambda: call(sock, "daemon.status")["zygote"]["process"]["state"] == "RUNNING",
        120,
        0.2,
        "zygote back",
    )
    wait_for(lambda: _idle(sock, "bea"), 60, 0.2, "bea IDLE again")
    assert _watchers(tmp_path, memd.proc.pid) == {"ann": 0, "bea": 0}
    _record(sock, "bea", "Which berth is the yacht?", "The yacht is at berth Skua-8.")
    _recallable(sock, "bea", "yacht berth", "Skua-8", "a wake after the zygote came back")
