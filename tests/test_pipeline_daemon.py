"""Per-client pipelines under the real daemon: restarts, FATAL, reload, shutdown, leftovers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess, base_config, write_config

pytestmark = pytest.mark.slow

CLIENTS = {
    "alpha": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "beta": {"memory_enabled": True, "mode": "both"},
}


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("condition not met in time")


def child(memd: DaemonProcess, client: str, name: str) -> dict[str, Any]:
    return memd.call("daemon.status")["clients"].get(client, {}).get(name) or {}


def running(memd: DaemonProcess, client: str) -> bool:
    return all(
        child(memd, client, n).get("state") == "RUNNING" for n in ("index_server", "watcher")
    )


def our_processes(tmp: Path) -> list[psutil.Process]:
    """Processes whose command line mentions this test's folder (watchers, index servers)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(tmp) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def record(memd: DaemonProcess, client: str, user: str, assistant: str) -> dict[str, Any]:
    return memd.call(
        "memory.record_exchange",
        {"client_id": client, "conversation_id": "c1", "user": user, "assistant": assistant},
    )


def found(memd: DaemonProcess, client: str, query: str, needle: str) -> bool:
    try:
        result = memd.call("memory.recall", {"client_id": client, "query": query})
    except RemoteError:
        return False
    return any(needle in r["content"] for r in result["results"])


def heavy_libraries(pid: int) -> set[str]:
    """Shared objects of pymilvus's stack (gRPC, pandas, pyarrow) mapped into `pid`: what
    importing pymilvus leaves in a process, and nothing else memd imports brings in."""
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
        paths = {line.split()[-1] for line in fh if "/" in line}
    return {p for p in paths if any(f"/{lib}/" in p for lib in ("grpc", "pandas", "pyarrow"))}


def test_killed_watcher_comes_back_and_catches_up(config_file, daemon_factory, tmp_path) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    wait_for(lambda: running(memd, "alpha"))
    record(memd, "alpha", "Which train goes to Lyon?", "The 8:14 TGV goes to Lyon.")
    wait_for(lambda: found(memd, "alpha", "train to Lyon", "8:14 TGV"))
    first = child(memd, "alpha", "watcher")
    os.kill(first["pid"], signal.SIGKILL)
    record(
        memd,
        "alpha",
        "What is the wifi password at the cabin?",
        "The cabin wifi password is moose-lantern-42.",
    )
    wait_for(
        lambda: (
            child(memd, "alpha", "watcher").get("pid") not in (None, first["pid"])
            and child(memd, "alpha", "watcher").get("state") == "RUNNING"
        )
    )
    assert child(memd, "alpha", "watcher")["restarts"] >= 1
    wait_for(lambda: found(memd, "alpha", "cabin wifi password", "moose-lantern-42"))
    # The restart's catch-up ran in a child of its own and reported back; after recalls
    # and that catch-up, memd itself has loaded none of pymilvus's stack.
    catch_up_log = tmp_path / "memory" / "alpha" / ".memd" / "logs" / "catch_up.log"
    wait_for(lambda: catch_up_log.exists() and "catch_up_done" in catch_up_log.read_text())
    assert memd.proc is not None and heavy_libraries(memd.proc.pid) == set()


def test_crash_looping_client_goes_fatal_others_keep_working(
    config_file, daemon_factory, tmp_path
) -> None:
    from memd import indexing
    from memd.config import load_config
    from memd.layout import ClientLayout

    path = config_file(clients=CLIENTS)
    layout = ClientLayout(tmp_path / "memory", "beta")
    indexing.ensure_dirs(layout)
    indexing.write_spec(layout, indexing.index_spec(load_config(path), layout))
    # The index server cannot open a database that is a file: it dies at every start.
    indexing.milvus_data_dir(layout).write_text("not a folder")
    memd = daemon_factory(path)
    wait_for(lambda: child(memd, "beta", "index_server").get("state") == "FATAL", timeout=120)
    status = child(memd, "beta", "index_server")
    assert status["last_error"]
    assert child(memd, "beta", "watcher").get("state") != "RUNNING"
    wait_for(lambda: running(memd, "alpha"))
    record(memd, "alpha", "Where is the dentist?", "The dentist is on Rue Verte.")
    wait_for(lambda: found(memd, "alpha", "dentist address", "Rue Verte"))
    with pytest.raises(RemoteError) as err:
        memd.call("memory.recall", {"client_id": "beta", "query": "anything"})
    assert err.value.kind == "index_unavailable"
    # Recording still works for the broken client: transcripts never depend on the index.
    assert record(memd, "beta", "still here?", "yes")["conversation"] == 1
    # Once the cause is fixed, a reset brings the client back, and what it recorded
    # meanwhile is indexed from the markdown files.
    indexing.milvus_data_dir(layout).unlink()
    assert memd.call("clients.reset", {"client_id": "beta"}) == {"reset": True}
    wait_for(lambda: running(memd, "beta"), timeout=120)
    wait_for(lambda: found(memd, "beta", "still here", "still here?"))


def test_disabling_a_client_stops_its_processes(config_file, daemon_factory, tmp_path) -> None:
    # its own index server too (the shared one keeps serving alpha: test_shared_index_daemon)
    per_client = {"shared_index_server": False}
    path = config_file(clients=CLIENTS, supervision=per_client)
    memd = daemon_factory(path)
    wait_for(lambda: running(memd, "alpha") and running(memd, "beta"))
    pids = [child(memd, "beta", n)["pid"] for n in ("index_server", "watcher")]
    alpha = {"alpha": CLIENTS["alpha"]}
    write_config(path, base_config(tmp_path, clients=alpha, supervision=per_client))
    wait_for(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
        ),
        timeout=30,
    )
    assert running(memd, "alpha")
    write_config(path, base_config(tmp_path, clients=CLIENTS, supervision=per_client))
    wait_for(lambda: running(memd, "beta"))


def test_sigterm_stops_everything_and_leaves_nothing(config_file, daemon_factory, tmp_path) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    wait_for(lambda: running(memd, "alpha") and running(memd, "beta"))
    assert len(our_processes(tmp_path)) >= 4
    started = time.monotonic()
    assert memd.stop(signal.SIGTERM, timeout=15) == 0
    assert time.monotonic() - started < 10
    assert wait_for(
        lambda: not our_processes(tmp_path) or None, timeout=5
    ) is None or not our_processes(tmp_path)


def test_restart_after_kill9_leaves_one_watcher_per_client(
    config_file, daemon_factory, tmp_path
) -> None:
    path = config_file(clients=CLIENTS)
    memd = daemon_factory(path)
    wait_for(lambda: running(memd, "alpha") and running(memd, "beta"))
    memd.kill(signal.SIGKILL)
    memd.proc.wait(10)
    again = daemon_factory(path)
    wait_for(lambda: running(again, "alpha") and running(again, "beta"))
    time.sleep(2)  # let any straggler show itself
    watchers = [
        p
        for p in our_processes(tmp_path)
        if "watch" in " ".join(p.cmdline()) and "memsearch" in " ".join(p.cmdline())
    ]
    per_client = sorted(
        next(c for c in CLIENTS if f"/{c}/sessions" in " ".join(p.cmdline())) for p in watchers
    )
    assert per_client == ["alpha", "beta"]
