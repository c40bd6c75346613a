"""`memd export` when the daemon is not running reads the files (issue 24 item 13, part).

The README says the files are the user's: export must not need the daemon. Exchanges
are recorded through a real `memd run` (MCP conversations and a chat); the export taken
while it runs and the one taken after it stopped are the same, line for line, MCP
conversation ids included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import REPO, write_config

pytestmark = pytest.mark.slow

CLIENT = "laptop"


def test_export_from_the_files_when_memd_is_down(tmp_path: Path, daemon_factory) -> None:
    config = write_config(
        tmp_path / "config.toml",
        {
            "memory_dir": str(tmp_path / "memory"),
            "socket": str(tmp_path / "run" / "memd.sock"),
            "clients": {CLIENT: {"memory_enabled": True, "mode": "both"}, "empty": {}},
        },
    )
    memd = daemon_factory(config)
    for conv, user, when in (
        ("plan", "Where is the spare key?", "2026-10-01T08:00:00Z"),
        ("trip", "Train at 7?", "2026-11-02T09:00:00Z"),
    ):
        memd.call(
            "memory.record_exchange",
            {
                "client_id": CLIENT,
                "conversation_id": conv,
                "user": user,
                "assistant": "Noted ✓",
                "timestamp": when,
            },
        )
    memd.call(
        "memory.record_chat",
        {
            "client_id": CLIENT,
            "messages": [{"role": "user", "content": "Chat question?"}],
            "response": {"role": "assistant", "content": "Chat answer."},
            "timestamp": "2026-11-21T10:00:00Z",
        },
    )

    def export(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd.cli", "export", *args, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "HOME": str(tmp_path / "home")},
        )

    online = export(CLIENT)
    assert online.returncode == 0, online.stderr
    recent_online = export(CLIENT, "--after", "2026-11-01", "--format", "markdown")
    memd.stop()

    offline = export(CLIENT)
    assert offline.returncode == 0, offline.stderr
    assert "exporting from the files" in offline.stderr
    assert offline.stdout == online.stdout
    records = [json.loads(line) for line in offline.stdout.splitlines()]
    assert [r.get("conversation_id") for r in records] == ["plan", "trip", None]
    assert export(CLIENT, "--after", "2026-11-01", "--format", "markdown").stdout == (
        recent_online.stdout
    )
    assert export("empty").stdout == ""
    unknown = export("nobody")
    assert unknown.returncode != 0 and "unknown client" in unknown.stderr
