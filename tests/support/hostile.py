"""Another local user, for the trust tests: an unprivileged uid and a folder it can reach.

The tests run as root (as the fault suite does); the attacker's steps run as uid/gid
65534 (`nobody`) through `setpriv`, with no supplementary groups. pytest's `tmp_path`
sits under a 0700 folder that nobody can traverse, so `open_area()` makes a 0755 folder
directly under the system temp dir for the paths an attacker must reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.daemon import DaemonProcess, write_config

NOBODY = 65534


def hostile_unavailable() -> str | None:
    """Why attacker steps cannot run as another uid here (None when they can)."""
    if os.geteuid() != 0:
        return "running steps as another uid needs root"
    if shutil.which("setpriv") is None:
        return "setpriv(1) is not installed"
    return None


needs_hostile = pytest.mark.skipif(
    hostile_unavailable() is not None, reason=hostile_unavailable() or ""
)


def as_nobody(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run argv as uid/gid 65534 with no supplementary groups."""
    return subprocess.run(
        ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def nobody_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A Python snippet run as the attacker (`sys.argv[1:]` are `args`)."""
    return as_nobody(sys.executable, "-I", "-S", "-c", code, *args)


@contextlib.contextmanager
def open_area() -> Iterator[Path]:
    """A 0755 root-owned folder under /tmp that other users can traverse; removed after."""
    area = Path(tempfile.mkdtemp(prefix="memd-trust-", dir="/tmp"))
    os.chmod(area, 0o755)
    try:
        yield area
    finally:
        shutil.rmtree(area, ignore_errors=True)


def area_config(area: Path, clients: dict[str, Any], **extra: Any) -> Path:
    """A config whose memory_dir, socket and HOME live in `area`."""
    data: dict[str, Any] = {
        "memory_dir": str(area / "memory"),
        "socket": str(area / "run" / "memd.sock"),
        "clients": clients,
    }
    data.update(extra)
    return write_config(area / "config.toml", data)


def start_refused(config: Path, timeout: float = 30.0) -> tuple[int, str]:
    """Start `memd run` that is expected to refuse to serve: its exit code and its log."""
    memd = DaemonProcess(config).start(wait=False)
    assert memd.proc is not None
    try:
        code = memd.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        memd.stop()
        log = memd.log()[-3000:]
        raise AssertionError(f"memd started although it should have refused:\n{log}") from None
    return code, memd.log()


def sleeper(seconds: int = 900) -> subprocess.Popen[bytes]:
    """A process of root's that a planted pidfile can describe (`sleep`)."""
    return subprocess.Popen(["sleep", str(seconds)], start_new_session=True)


def pidfile_record(proc: subprocess.Popen[bytes], argv: Sequence[str], stop_signal: int = 9) -> str:
    """What memd writes into a pidfile, describing `proc` (all of it readable from /proc)."""
    return json.dumps(
        {
            "pid": proc.pid,
            "create_time": psutil.Process(proc.pid).create_time(),
            "argv": list(argv),
            "name": "planted",
            "stop_signal": stop_signal,
            "memd_pid": 1,
        }
    )


def private_violations(root: Path) -> list[str]:
    """Files under `root` readable by group/others and folders not 0700."""
    bad = []
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if path.is_symlink() or path.is_socket():
            continue
        mode = st.st_mode & 0o777
        if (path.is_dir() and mode != 0o700) or (path.is_file() and mode & 0o077):
            bad.append(f"{path} {mode:o}")
    return bad
