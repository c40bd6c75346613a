"""Children an earlier memd left behind: pidfiles, telling ours from a reused pid, reaping.

A pidfile (written by memd.supervision.procs when a child starts) records the child's
pid, create time, program and stop signal. `reap_leftovers` runs at start, before any
child is spawned: a record that still names a live process of ours, running the program
recorded, gets its stop signal and then SIGKILL; anything else is stale and left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import structlog

from memd import trust
from memd.trust import UntrustedPath

log = structlog.get_logger()

_CREATE_TIME_SLACK = 1.0  # /proc/stat btime can jitter by a second between reads


def _forget(path: Path) -> None:
    """Remove a pidfile; a read-only or broken disk must not stop memd from starting."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("pidfile.not_removed", path=str(path), error=str(exc))


def read_pidfile(path: Path) -> dict[str, Any] | None:
    """The JSON record memd wrote, or None when missing or not a record of ours."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    return record


def cmdline_matches(argv: Sequence[str], cmdline: Sequence[str]) -> bool:
    """Whether a live process's cmdline is the program memd recorded.

    Exact match, or the recorded arguments as the tail and the recorded program's name
    among the words before them: covers `#!` scripts (the kernel runs
    `python /venv/bin/memsearch watch ...`) and a child still in the trampoline.
    """
    argv, cmdline = list(argv), list(cmdline)
    if not argv or not cmdline:
        return False
    if argv == cmdline:
        return True
    args = argv[1:]
    if len(cmdline) <= len(args) or (args and cmdline[-len(args) :] != args):
        return False
    name = os.path.basename(argv[0])
    return any(os.path.basename(word) == name for word in cmdline[: len(cmdline) - len(args)])


def process_title(argv: Sequence[str]) -> str:
    """The title a child forked by the zygote shows as its command line."""
    return " ".join(argv)


def title_matches(title: str, cmdline: Sequence[str]) -> bool:
    """Whether a live process shows this title (setproctitle pads it with NULs, and may
    cut a long one to the size of the original argv area)."""
    shown = " ".join(cmdline).strip()
    return bool(shown) and (shown == title or (len(shown) >= 64 and title.startswith(shown)))


def _recorded_process(record: dict[str, Any]) -> psutil.Process | None:
    """The live process a pidfile describes, or None if that pid is now someone else."""
    try:
        proc = psutil.Process(record["pid"])
        created = float(record["create_time"])
        if abs(proc.create_time() - created) > _CREATE_TIME_SLACK:
            return None
        if proc.uids().real != os.getuid() or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if "title" in record:  # forked from the zygote: its title is its command line
            if not title_matches(str(record["title"]), proc.cmdline()):
                return None
        elif not cmdline_matches(record["argv"], proc.cmdline()):
            return None
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None
    return proc


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until the processes are gone (zombies count: their reaper is not us)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _gone(p)]
    return alive


def _signal_group(proc: psutil.Process, sig: int) -> None:
    """Its process group if it leads one (memd's children do), else just the process."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)


STOP_SIGNALS = frozenset((signal.SIGINT, signal.SIGTERM))


def reap_leftovers(
    pidfile_dir: Path,
    *,
    timeout: float = 5.0,
    pattern: str = "*.pid",
    expected: Callable[[Sequence[str]], bool] | None = None,
) -> list[int]:
    """Stop children an earlier memd left behind; call it before starting new ones.

    For each pidfile in pidfile_dir: if its pid is alive with the recorded create_time,
    the recorded program as cmdline and our uid, its process group gets the recorded stop
    signal, then SIGKILL after `timeout`. Anything else is a stale record (the pid may now
    belong to an unrelated process) and is left alone. All matching pidfiles are removed.
    Returns the pids that were stopped. Blocking (up to 2 x timeout): run it at startup.

    Everything in a pidfile can be read from /proc by anyone, so a record proves nothing
    by itself: `expected(argv)` says whether the recorded program is one the caller
    starts (memd: its index server or watcher for that very client); others are left
    alone. A pidfile that is a symlink or not ours is ignored, and the recorded stop
    signal is used only if it is SIGINT or SIGTERM.
    """
    found: list[tuple[Path, psutil.Process, int]] = []
    for path in sorted(pidfile_dir.glob(pattern)):
        leftover = _leftover(path, expected)
        if leftover is not None:
            found.append((path, *leftover))
    for _, proc, sig in found:
        _signal_group(proc, sig)
    alive = _wait_gone([proc for _, proc, _ in found], timeout)
    for proc in alive:
        log.warning("child.leftover_escalated", pid=proc.pid)
        _signal_group(proc, signal.SIGKILL)
    for proc in _wait_gone(alive, timeout):
        log.error("child.leftover_survived", pid=proc.pid)
    for path, _, _ in found:
        _forget(path)
    return [proc.pid for _, proc, _ in found]


def _leftover(
    path: Path, expected: Callable[[Sequence[str]], bool] | None
) -> tuple[psutil.Process, int] | None:
    """The live child a pidfile names and the signal that stops it; None (the pidfile
    removed, unless it is not ours to touch) when it names no process of ours."""
    try:
        trust.check_file(path, tighten=False)
    except UntrustedPath as exc:
        log.warning("pidfile.untrusted", path=str(path), error=str(exc))
        return None
    record = read_pidfile(path)
    if record is not None and expected is not None and not _expected(record, expected):
        log.warning("pidfile.not_ours", path=str(path), argv=record.get("argv"))
        record = None
    proc = _recorded_process(record) if record is not None else None
    if record is None or proc is None:
        log.info("child.stale_pidfile_removed", path=str(path), pid=(record or {}).get("pid"))
        _forget(path)
        return None
    sig = int(record.get("stop_signal", signal.SIGTERM))
    if sig not in STOP_SIGNALS:
        sig = signal.SIGTERM
    log.warning("child.leftover_stopping", name=record.get("name"), pid=proc.pid)
    return proc, sig


def _expected(record: dict[str, Any], expected: Callable[[Sequence[str]], bool]) -> bool:
    argv = record.get("argv")
    return isinstance(argv, list) and all(isinstance(a, str) for a in argv) and expected(argv)
