"""Catch-ups follow the children's transitions, not a poll (issue 29: wake-ups).

memd used to look every 2 s whether a client's children had new pids. Now a transition
to RUNNING of a child the pipeline needs starts the catch-up: after a kill -9 of the
watcher, of the embedder (its pid is part of what a catch-up is keyed on) and of the
shared index server, a catch-up child runs once the replacement is RUNNING (a child
is spawned only when a session file changed since the last good moment: each kill is
followed by a record), and what was recorded meanwhile is found. Real daemon, real
memsearch, real Milvus Lite.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.test_catch_up_restart import catch_up_children
from tests.test_pipeline_daemon import child, found, record, running, wait_for

pytestmark = pytest.mark.slow

CLIENTS = {"alpha": {"memory_enabled": True, "mode": "mcp_via_llm"}}
SUPERVISION = {"shared_index_server": True, "watcher_idle_minutes": 0}


def catch_ups_done(tmp_path: Path) -> int:
    """Catch-up children of alpha that ran to their end (each reports once in its log)."""
    log = tmp_path / "memory" / "alpha" / ".memd" / "logs" / "catch_up.log"
    return log.read_text().count("catch_up_done") if log.exists() else 0


def embedder(memd: Any) -> dict[str, Any]:
    return memd.call("daemon.status").get("embedder") or {}


def test_each_restart_of_a_needed_child_is_caught_up(
    config_file, daemon_factory, tmp_path: Path
) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS, supervision=SUPERVISION))
    assert memd.proc is not None
    wait_for(lambda: running(memd, "alpha") and embedder(memd).get("state") == "RUNNING")
    wait_for(lambda: not catch_up_children(memd.proc.pid))  # the start's (nothing to do)
    victims = {
        "watcher": lambda: child(memd, "alpha", "watcher"),
        "embedder": lambda: embedder(memd),
        "index_server": lambda: child(memd, "alpha", "index_server"),
    }
    for n, (name, status) in enumerate(victims.items()):
        done = catch_ups_done(tmp_path)
        old = status()["pid"]
        os.kill(old, signal.SIGKILL)
        record(memd, "alpha", f"What is code {n}?", f"Code {n} of the {name} is heron-{n}7.")
        wait_for(lambda s=status, o=old: s().get("pid") not in (None, o))
        wait_for(lambda s=status: s().get("state") == "RUNNING")
        wait_for(lambda d=done: catch_ups_done(tmp_path) > d, timeout=90)
        wait_for(lambda n=n: found(memd, "alpha", f"code {n}", f"heron-{n}7"), timeout=90)
        wait_for(lambda: running(memd, "alpha"))
        wait_for(lambda: not catch_up_children(memd.proc.pid))
    assert "pipeline.catch_up_failed" not in memd.log()
