"""`[supervision] shared_index_server = true` in the real daemon: one index-server process
serves every client's database on the client's own socket; kill -9 of it under record load,
a client disabled while the other works, kill -9 of memd. Real memsearch, real Milvus Lite."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from memd.indexing.daemon.settings import index_socket_path
from memd.indexing.daemon.shared_index import SharedIndex
from memd.layout import ClientLayout
from tests.support.daemon import base_config, write_config
from tests.support.faults import (
    Tally,
    alive,
    call,
    child_status,
    cmdline,
    exchange_flood,
    pipeline_running,
    recall_finds,
    session_paths,
    user_texts,
    wait_for,
)
from tests.support.index import daemon_index_contents

pytestmark = [pytest.mark.slow, pytest.mark.faults]

CLIENTS = {
    "ann": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "bea": {"memory_enabled": True, "mode": "mcp_via_llm"},
}
SHARED = {"shared_index_server": True}
SHARED_MODULE = "memd.indexing.children.shared_index_server"


def _running(sock: Path, clients: Any = CLIENTS) -> bool:
    return all(pipeline_running(sock, c) for c in clients)


def _record(sock: Path, client: str, user: str, assistant: str) -> None:
    params = {"client_id": client, "conversation_id": "s", "user": user, "assistant": assistant}
    call(sock, "memory.record_exchange", params)


def _index_sockets(tmp_path: Path) -> dict[str, Path]:
    return {c: index_socket_path(ClientLayout(tmp_path / "memory", c)) for c in CLIENTS}


def _listening(pid: int) -> set[str]:
    """The Unix socket paths a process listens on."""
    return {c.laddr for c in psutil.Process(pid).net_connections(kind="unix") if c.laddr}


def _index_processes(memd_pid: int) -> dict[str, list[int]]:
    """memd's live children that serve an index: shared ones, per-client ones."""
    out: dict[str, list[int]] = {"shared": [], "per_client": []}
    for proc in psutil.Process(memd_pid).children():
        line = cmdline(proc)
        if not alive(proc.pid) or "memd.supervision.zygote" in line:
            continue  # the zygote's command line names every module it forks
        if SHARED_MODULE in line:
            out["shared"].append(proc.pid)
        elif "memd.indexing.children.index_server" in line:
            out["per_client"].append(proc.pid)
    return out


def _indexed_loads(memd: Any, client: str) -> set[str]:
    """The flood's user texts (`<client>/load/u<i>`) found in the client's index."""
    rows = daemon_index_contents(memd.config_path, memd.env["XDG_RUNTIME_DIR"], client)
    return set(re.findall(rf"{client}/load/u\d+", "\n".join(rows)))


def _one_shared_server(memd_pid: int, sockets: Any) -> int:
    """Exactly one index-server process, and it listens on each of `sockets`."""
    procs = _index_processes(memd_pid)
    assert len(procs["shared"]) == 1 and not procs["per_client"], procs
    [pid] = procs["shared"]
    served = _listening(pid)
    assert {str(s) for s in sockets} <= served, served
    return pid


def test_two_clients_record_and_recall_through_one_index_server_and_one_can_leave(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision=SHARED))
    sock = memd.socket
    wait_for(lambda: _running(sock), 180, 0.3, "pipelines RUNNING")
    pid = _one_shared_server(memd.proc.pid, _index_sockets(tmp_path).values())
    statuses = [child_status(sock, c, "index_server") for c in CLIENTS]
    assert {(s["pid"], s["name"], s["state"]) for s in statuses} == {
        (pid, "_shared/index", "RUNNING")
    }
    _record(sock, "ann", "Which shelf holds the atlas?", "The atlas is on shelf Marten-9.")
    _record(sock, "bea", "Where do the herons nest?", "The herons nest by Weir Kestrel-3.")
    for client, query, needle in (
        ("ann", "atlas shelf", "Marten-9"),
        ("bea", "herons nest", "Kestrel-3"),
    ):
        wait_for(
            lambda c=client, q=query, n=needle: recall_finds(sock, c, q, n),
            90,
            0.3,
            f"{client}'s exchange recallable through the shared index server",
        )
    assert not recall_finds(sock, "bea", "atlas shelf", "Marten-9")  # databases stay apart

    applied = memd.log().count("config.applied")
    off = {**CLIENTS, "bea": {**CLIENTS["bea"], "memory_enabled": False}}
    write_config(memd.config_path, base_config(tmp_path, clients=off, supervision=SHARED))
    wait_for(lambda: memd.log().count("config.applied") > applied, 30, 0.1, "config applied")
    sockets = _index_sockets(tmp_path)
    wait_for(lambda: not sockets["bea"].exists(), 30, 0.1, "bea's index socket removed")
    assert _one_shared_server(memd.proc.pid, [sockets["ann"]]) == pid  # the same process
    assert str(sockets["bea"]) not in _listening(pid)
    _record(sock, "ann", "What is the ferry called?", "The ferry is the Plover-12.")
    wait_for(
        lambda: recall_finds(sock, "ann", "ferry called", "Plover-12"),
        90,
        0.3,
        "ann still indexed and recalled after bea left",
    )
    # forget drops ann's index (its last client stops the shared process) and rebuilds it
    with memd.client(timeout=300) as client:
        client.call("memory.forget", {"client_id": "ann", "all": True})
    assert not recall_finds(sock, "ann", "ferry called", "Plover-12")
    _record(sock, "ann", "Where is the spare oar?", "The spare oar is under the Tern-5 bench.")
    wait_for(
        lambda: recall_finds(sock, "ann", "spare oar", "Tern-5"),
        90,
        0.3,
        "ann indexed again after forget rebuilt its index",
    )
    _one_shared_server(memd.proc.pid, [sockets["ann"]])


OUTAGE = {
    "ann": ("What colour is the lighthouse door?", "The lighthouse door is Gannet-77."),
    "bea": ("Which bell rings at noon?", "The noon bell is Osprey-31."),
}


def test_kill_9_of_the_shared_index_server_under_load_loses_nothing(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision=SHARED))
    sock = memd.socket
    wait_for(lambda: _running(sock), 180, 0.3, "pipelines RUNNING")
    pid = _one_shared_server(memd.proc.pid, _index_sockets(tmp_path).values())
    tally, stop = Tally(), threading.Event()
    floods = [
        threading.Thread(
            target=exchange_flood, args=(sock, c, "load", tally, stop), kwargs={"pause": 0.01}
        )
        for c in CLIENTS
    ]
    for t in floods:
        t.start()
    try:
        wait_for(lambda: tally.count() >= 50, 60, 0.01, "50 acknowledged records")
        os.kill(pid, signal.SIGKILL)
        for client, (user, answer) in OUTAGE.items():  # recorded while the index is down
            _record(sock, client, user, answer)
        wait_for(
            lambda: child_status(sock, "ann", "index_server")["pid"] not in (None, pid),
            60,
            0.1,
            "shared index server restarted",
        )
        wait_for(lambda: _running(sock), 120, 0.2, "pipelines RUNNING after the kill")
        count = tally.count()
        wait_for(lambda: tally.count() >= count + 50, 60, 0.01, "50 more records")
    finally:
        stop.set()
        for t in floods:
            t.join(60)
    assert not tally.refused, tally.refused
    for client in CLIENTS:
        found = [t for t in user_texts(session_paths(sock, client)) if t.startswith(f"{client}/")]
        acked = [t for t in tally.acked if t.startswith(f"{client}/")]
        assert sorted(found) == sorted(acked), f"{client}: transcripts differ from the acks"
    for client, (user, answer) in OUTAGE.items():
        needle = answer.rsplit(" ", 1)[1].rstrip(".")
        wait_for(
            lambda c=client, q=user, n=needle: recall_finds(sock, c, q, n),
            120,
            0.5,
            f"{client}'s exchange recorded during the outage recallable",
        )
    for client in CLIENTS:  # the markdown is the truth: catch-up re-indexed what was in flight
        acked = {t for t in tally.acked if t.startswith(f"{client}/")}
        wait_for(
            lambda c=client, a=acked: not a - _indexed_loads(memd, c),
            120,
            0.5,
            f"every acknowledged record of {client} indexed after the kill",
        )
    time.sleep(1)  # a straggler would show itself now
    new_pid = _one_shared_server(memd.proc.pid, _index_sockets(tmp_path).values())
    assert new_pid != pid
    watchers = [child_status(sock, c, "watcher")["pid"] for c in CLIENTS]
    memd.kill(signal.SIGKILL)
    memd.proc.wait(10)
    wait_for(
        lambda: not any(alive(p) for p in [new_pid, *watchers]),
        10,
        0.1,
        "the shared index server and the watchers dying with memd",
    )


def test_a_shared_index_server_that_cannot_start_falls_back_to_one_per_client(
    config_file, daemon_factory, tmp_path, monkeypatch
) -> None:
    # The daemon's runtime folder, known here (short: its sockets' paths must fit AF_UNIX).
    runtime = Path(tempfile.mkdtemp(prefix="memd-rt-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    # A folder where the control socket goes: the shared process exits at every start.
    control = SharedIndex.control_path(tmp_path / "memory")
    control.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    control.mkdir()
    try:
        memd = daemon_factory(config_file(clients={"ann": CLIENTS["ann"]}, supervision=SHARED))
        sock = memd.socket
        wait_for(lambda: _running(sock, ["ann"]), 180, 0.3, "ann RUNNING after the fallback")
        status = child_status(sock, "ann", "index_server")
        assert status["name"] == "ann/index", status
        assert memd.log().count("index.shared_server_unavailable") == 1
        procs = _index_processes(memd.proc.pid)
        assert not procs["shared"] and len(procs["per_client"]) == 1, procs
    finally:
        control.rmdir()
