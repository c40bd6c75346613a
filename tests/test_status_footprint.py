"""`memd status` shows the whole tree's footprint, memd and every child, in PSS (issue 24,
item 13): memd's own RSS left out the zygote, index servers and watchers."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.support.daemon import REPO
from tests.support.faults import call, pipeline_running, wait_for

MCP = {"memory_enabled": True, "mode": "mcp_via_llm"}


def test_status_counts_every_child_in_pss(daemon_factory, config_file) -> None:
    memd = daemon_factory(config_file(clients={"alice": MCP}))
    sock = memd.socket
    wait_for(lambda: pipeline_running(sock, "alice"), 120, what="alice's children")
    tree = [memd.proc.pid, *(p.pid for p in psutil.Process(memd.proc.pid).children(True))]
    time.sleep(11)  # the footprint is read at most every 10 s
    status = call(sock, "daemon.status")
    # memd, the zygote, the index server and the watcher (a catch-up child may come and go)
    assert status["tree_processes"] >= 4 and abs(status["tree_processes"] - len(tree)) <= 1
    assert status["tree_pss_bytes"] > status["rss_bytes"]
    out = subprocess.run(
        [sys.executable, "-m", "memd.cli", "status", "--config", str(memd.config_path)],
        capture_output=True,
        text=True,
        env=memd.env,
        cwd=str(REPO),
        timeout=60,
        check=True,
    ).stdout
    assert f"PSS with {status['tree_processes'] - 1} children" in out.splitlines()[0], out
