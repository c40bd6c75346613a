"""Children's log files: where stdout and stderr of a child go, and how they stay bounded.

stdout and stderr of the child go straight to its log file (an O_APPEND fd). Before each
spawn a log over `log_max_bytes` is renamed to `.1` (`.1` -> `.2`, ... keeping
`log_backups`). While a child runs, `housekeep()` (called by the supervisor every few
seconds) copies an oversized log to `.1` and truncates it in place (logrotate's
copytruncate; O_APPEND makes the child continue at the new end). A few lines written
during the copy may be lost; that is the price of not asking the child to reopen its log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec

_TAIL_BYTES = 4096
_TAIL_LINES = 20
_SECRET_WORDS = ("key", "token", "secret", "password")


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv for logs: the value of any --*key*/--*token*/--*secret*/--*password* option
    is replaced by "***". (Better still, pass secrets in the environment: a command line
    is readable by every user of the machine through /proc.)"""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        option, eq, _ = word.partition("=")
        secret = option.startswith("-") and any(w in option.lower() for w in _SECRET_WORDS)
        if secret and eq:
            out.append(f"{option}=***")
        else:
            out.append(word)
            hide_next = secret
    return out


def open_log(spec: ChildSpec) -> int:
    """The fd a child's stdout and stderr go to (rotated first, a start line written)."""
    if spec.log_path is None:
        return subprocess.DEVNULL
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(spec.log_path, spec.log_max_bytes, spec.log_backups, live=False)
    fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    command = " ".join(redact_argv(spec.argv))
    os.write(fd, f"--- memd {stamp}: starting {spec.name}: {command}\n".encode())
    return fd


def rotate_log(path: Path, max_bytes: int, backups: int, *, live: bool) -> bool:
    """Shift `path` to `path.1` (and older ones up to `.backups`) once it exceeds max_bytes.

    live=False renames (nobody writes the file); live=True copies then truncates in place,
    because a running child keeps writing through its own fd.
    """
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    if backups > 0:
        for i in range(backups - 1, 0, -1):
            older = path.with_name(f"{path.name}.{i}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
        first = path.with_name(f"{path.name}.1")
        if live:
            shutil.copyfile(path, first)
        else:
            os.replace(path, first)
            return True
    os.truncate(path, 0)
    return True


def read_tail(path: Path, max_bytes: int = _TAIL_BYTES, max_lines: int = _TAIL_LINES) -> str:
    """The last lines of a log, for status output when a child has given up."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-max_lines:])
