"""The zygote in the real daemon: forked index servers and `memsearch watch` processes,
kill -9 of a child, of the zygote and of memd under record load, and the setting that
turns the zygote off. Real memsearch, real Milvus Lite, the embedded model."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.faults import (
    Tally,
    alive,
    call,
    child_status,
    children_by_client,
    cmdline,
    exchange_flood,
    pipeline_running,
    processes_mentioning,
    recall_finds,
    session_paths,
    user_texts,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults]

CLIENTS = {
    "ann": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "bea": {"memory_enabled": True, "mode": "mcp_via_llm"},
}
# An index server per client: these tests count and kill each client's forked children
# (the shared one is tested in test_shared_index_daemon.py).
PER_CLIENT = {"shared_index_server": False}


OUTAGE = {
    "ann": ("What colour is the lighthouse door?", "The lighthouse door is Gannet-77."),
    "bea": ("Which ferry leaves at dusk?", "The dusk ferry is the Plover-12."),
}


def _running(sock: Path) -> bool:
    return all(pipeline_running(sock, c) for c in CLIENTS)


def _zygote(sock: Path) -> dict[str, Any]:
    return call(sock, "daemon.status")["zygote"]


def _zygote_pid(sock: Path) -> int | None:
    return (_zygote(sock).get("process") or {}).get("pid")


def _one_each(tmp_path: Path, memd_pid: int) -> dict[str, dict[str, int]]:
    procs = processes_mentioning(tmp_path / "memory", exclude=(memd_pid,))
    counts = children_by_client(procs, tmp_path / "memory", sorted(CLIENTS))
    assert all(c == {"watcher": 1, "index_server": 1} for c in counts.values()), (
        counts,
        [cmdline(p) for p in procs],
    )
    return counts


def _record(sock: Path, client: str, user: str, assistant: str) -> None:
    call(
        sock,
        "memory.record_exchange",
        {"client_id": client, "conversation_id": "z", "user": user, "assistant": assistant},
    )


def test_children_are_forked_separate_processes_running_watch_and_index_server(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision=PER_CLIENT))
    sock = memd.socket
    wait_for(lambda: _running(sock), 180, 0.3, "pipelines RUNNING")
    zygote = _zygote(sock)
    assert zygote["enabled"] is True and zygote["forked"] >= 4, zygote
    zpid = zygote["process"]["pid"]
    pids = set()
    for client in CLIENTS:
        for name, module in (
            ("index_server", "memd.indexing.children.index_server"),
            ("watcher", "memd.indexing.children.memsearch_watch"),
        ):
            pid = child_status(sock, client, name)["pid"]
            proc = psutil.Process(pid)
            assert proc.ppid() == memd.proc.pid and pid != zpid  # memd's child, not the zygote's
            assert os.getpgid(pid) == pid
            assert module in " ".join(proc.cmdline())
            pids.add(pid)
    assert len(pids) == 4
    _one_each(tmp_path, memd.proc.pid)
    _record(sock, "ann", "Which shelf holds the atlas?", "The atlas is on shelf Marten-9.")
    wait_for(
        lambda: recall_finds(sock, "ann", "atlas shelf", "Marten-9"),
        90,
        0.3,
        "an exchange indexed by a forked watcher into a forked index server",
    )


def test_kill_9_of_children_and_zygote_under_load_loses_nothing_and_leaves_one_each(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision=PER_CLIENT))
    sock = memd.socket
    wait_for(lambda: _running(sock), 180, 0.3, "pipelines RUNNING")
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
        os.kill(child_status(sock, "ann", "watcher")["pid"], signal.SIGKILL)
        os.kill(child_status(sock, "bea", "index_server")["pid"], signal.SIGKILL)
        zpid = _zygote(sock)["process"]["pid"]
        os.kill(zpid, signal.SIGKILL)
        for client, (user, answer) in OUTAGE.items():  # recorded while children are down
            _record(sock, client, user, answer)
        for _ in range(3):  # and the zygote killed again while children come back
            wait_for(
                lambda old=zpid: _zygote_pid(sock) not in (None, old), 60, 0.1, "zygote restarted"
            )
            zpid = _zygote(sock)["process"]["pid"]
            os.kill(zpid, signal.SIGKILL)
        wait_for(lambda: _running(sock), 120, 0.2, "pipelines RUNNING after the kills")
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
    wait_for(lambda: _zygote(sock)["process"]["state"] == "RUNNING", 120, 0.2, "zygote back")
    time.sleep(2)  # a straggler would show itself now
    _one_each(tmp_path, memd.proc.pid)
    zygotes = [
        p
        for p in psutil.Process(memd.proc.pid).children()
        if "memd.supervision.zygote" in cmdline(p) and alive(p.pid)
    ]
    assert len(zygotes) == 1, [cmdline(p) for p in zygotes]


def test_kill_9_of_memd_takes_zygote_and_forked_children_along(
    config_file, daemon_factory, tmp_path
) -> None:
    path = config_file(clients=CLIENTS, supervision=PER_CLIENT)
    memd = daemon_factory(path)
    sock = memd.socket
    wait_for(lambda: _running(sock), 180, 0.3, "pipelines RUNNING")
    zpid = _zygote(sock)["process"]["pid"]
    kids = [child_status(sock, c, n)["pid"] for c in CLIENTS for n in ("watcher", "index_server")]
    memd.kill(signal.SIGKILL)
    memd.proc.wait(10)
    wait_for(
        lambda: not any(alive(p) for p in [zpid, *kids]),
        10,
        0.1,
        "zygote and children dying with memd",
    )
    again = daemon_factory(path)
    wait_for(lambda: _running(again.socket), 180, 0.3, "pipelines RUNNING after restart")
    time.sleep(2)
    _one_each(tmp_path, again.proc.pid)


def test_zygote_disabled_by_the_setting_spawns_plainly(
    config_file, daemon_factory, tmp_path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision={**PER_CLIENT, "zygote": False}))
    sock = memd.socket
    wait_for(lambda: _running(sock), 180, 0.3, "pipelines RUNNING")
    zygote = _zygote(sock)
    assert (zygote["enabled"], zygote["forked"], zygote.get("process")) == (False, 0, None)
    assert not any(
        "memd.supervision.zygote" in cmdline(p) for p in psutil.Process(memd.proc.pid).children()
    )
    _one_each(tmp_path, memd.proc.pid)
    _record(sock, "bea", "Where do the herons nest?", "The herons nest by Weir Kestrel-3.")
    wait_for(
        lambda: recall_finds(sock, "bea", "herons nest", "Kestrel-3"),
        90,
        0.3,
        "recall with plainly spawned children",
    )
