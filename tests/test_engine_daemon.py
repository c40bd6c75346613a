"""Under the real daemon: an index server whose engine is not the pinned version is FATAL,
and `memd status` says why (package, found, expected) instead of a bare exit code."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_engine import ROOT, fake_dist
from tests.test_pipeline_daemon import child, wait_for

pytestmark = pytest.mark.slow


def test_an_index_server_on_another_milvus_lite_is_fatal_and_status_says_why(
    config_file, daemon_factory, tmp_path
) -> None:
    fake = fake_dist(tmp_path / "fake", "milvus-lite", "3.3.0")
    path = config_file(clients={"alpha": {"memory_enabled": True, "mode": "mcp_via_llm"}})
    memd = daemon_factory(path, env={"PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])})
    # The shared index server goes FATAL first, then the client's own one it falls back to.
    wait_for(
        lambda: (
            child(memd, "alpha", "index_server").get("name") == "alpha/index"
            and child(memd, "alpha", "index_server").get("state") == "FATAL"
        ),
        timeout=240,
    )
    assert child(memd, "alpha", "index_server")["last_error"] == "exit code 78 while starting"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from memd.cli.main import main; sys.exit(main())",
            "status",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "alpha index_server FATAL: exit code 78 while starting" in done.stdout, done.stdout
    assert (
        "its last log line: milvus-lite 3.3.0 is installed, memd needs milvus-lite==3.2.2"
        in done.stdout
    ), done.stdout
