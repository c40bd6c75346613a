"""The CLI and the daemon using different configs is said, not silent (issue 24 item 12).

The daemon is started with a relative `--config` from another folder, as the README's
demo does; `memd status` run with another config (that reaches the same socket) shows
the daemon's config by absolute path and a note that this command read another one;
`memd recall` for a client that only the CLI's config lists names the daemon's config
instead of telling the user to add a table their file already has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemon import REPO, DaemonProcess, write_config

pytestmark = pytest.mark.slow


def test_status_and_recall_name_the_daemons_config(
    tmp_path: Path, daemon_factory: Callable[..., DaemonProcess]
) -> None:
    paths = {"memory_dir": str(tmp_path / "memory"), "socket": str(tmp_path / "run" / "m.sock")}
    daemons = write_config(
        tmp_path / "demo.toml", {**paths, "clients": {"z": {"memory_enabled": True}}}
    )
    other = write_config(
        tmp_path / "mine.toml", {**paths, "clients": {"a": {"memory_enabled": True}}}
    )
    daemon_factory(Path(os.path.relpath(daemons, REPO)))  # relative, from the repo folder

    def memd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memd.cli", *args, "--config", str(other)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "HOME": str(tmp_path / "home")},
        )

    status = memd("status")
    assert status.returncode == 0, status.stderr
    assert f"config   {daemons}" in status.stdout  # absolute, whatever folder it is read from
    note = [ln for ln in status.stdout.splitlines() if ln.startswith("note")]
    assert note and str(other) in note[0] and "not the daemon's config" in note[0]

    recall = memd("recall", "a", "x")
    assert recall.returncode != 0
    assert str(daemons) in recall.stderr, recall.stderr
    assert str(other) in recall.stderr  # the file the user passed is named as not in use
