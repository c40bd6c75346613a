"""What a supervised child is, as data and seams: its spec, how it exited, its status, and
the `Spawner`/`Proc` protocols OS effects go through (memd.supervision.procs for real,
fakes in tests). The state machine that uses them is memd.supervision.child.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol


@dataclass(frozen=True)
class ChildSpec:
    """What to run and how to supervise it. Immutable: a changed program is a new spec.

    env is the child's whole environment (None: inherit memd's). stop_signal defaults to
    SIGINT because memd's children are Python programs whose cleanup runs on
    KeyboardInterrupt (memsearch watch skips it on SIGTERM), as watchfiles does.
    ready, if given, must be cheap and non-blocking (it runs on the event loop every tick):
    a child is RUNNING only once it is up startsecs *and* ready() is true; if it is not
    ready within ready_timeout it is SIGKILLed and counts as a fast failure, unless
    `progress` (given the pid: any value that changes while the child works, e.g. its
    CPU time and I/O, `procs.activity`) changed within the last ready_timeout: a child
    busy with a long start (a watcher's initial scan of a 35 MB session) is not stuck.
    ready and progress are not part of equality, so specs built twice compare equal.
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    log_path: Path | None = None
    pidfile: Path | None = None
    startsecs: float = 3.0
    startretries: int = 3
    backoff_start: float = 1.0
    backoff_cap: float = 60.0
    reset_after: float = 60.0
    stop_signal: int = signal.SIGINT
    stop_timeout: float = 10.0
    kill_timeout: float = 5.0
    ready: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    ready_timeout: float = 60.0
    progress: Callable[[int], object] | None = field(default=None, compare=False, repr=False)
    fatal_retry_after: float = 0.0  # > 0: FATAL is a pause of this many seconds, then reset
    log_max_bytes: int = 5 * 1024 * 1024
    log_backups: int = 3
    restart_at_once: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("child name must not be empty")
        argv = tuple(str(a) for a in self.argv)
        if not argv:
            raise ValueError(f"{self.name}: argv must not be empty")
        object.__setattr__(self, "argv", argv)
        if self.env is not None:
            object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        numbers: tuple[str, ...] = ("startsecs", "reset_after", "stop_timeout", "kill_timeout")
        numbers += ("ready_timeout", "startretries", "log_max_bytes", "log_backups")
        numbers += ("fatal_retry_after",)
        for name in numbers:
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0")
        if self.backoff_start <= 0:
            raise ValueError(f"{self.name}: backoff_start must be > 0 (no tight restart loops)")
        if self.backoff_cap < self.backoff_start:
            raise ValueError(f"{self.name}: backoff_cap must be >= backoff_start")


@dataclass(frozen=True)
class ExitInfo:
    """How a process ended: an exit code or the signal that killed it."""

    code: int | None
    signal: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitInfo:
        if returncode < 0:
            return cls(code=None, signal=-returncode)
        return cls(code=returncode, signal=None)

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def __str__(self) -> str:
        if self.signal is not None:
            return f"killed by {self.signal_name}"
        return f"exit code {self.code}"


@dataclass(frozen=True)
class Transition:
    """One state change of one child, as supervisord's PROCESS_STATE_* events: who, from
    what, to what, and the process it concerns (its pid while it had one; None once a
    stopped or failed start left none). `Supervisor.listen` hands these out, so that work
    that follows a state (a catch-up once a watcher is RUNNING again) is started by the
    change itself instead of a loop that looks every few seconds."""

    name: str
    old: str
    new: str
    pid: int | None


class Proc(Protocol):
    """A spawned process, as the state machine sees it."""

    pid: int

    def poll(self) -> int | None:
        """Popen-style returncode (negative: killed by that signal) once exited, else None."""

    def signal(self, sig: int) -> None:
        """Send sig to the process group; no error if it is gone."""

    def rss(self) -> int | None:
        """Resident memory in bytes (the child and its descendants), None if unknown."""

    def housekeep(self) -> None:
        """Periodic upkeep while alive (log size)."""

    def release(self) -> None:
        """Called once after the process was reaped (pidfile cleanup)."""


class Spawner(Protocol):
    def spawn(self, spec: ChildSpec) -> Proc:
        """Start the program; raise on failure (counts as a fast failure)."""

    def log_tail(self, spec: ChildSpec) -> str:
        """The end of the child's log, kept for status when it fails."""


@dataclass(frozen=True)
class ChildStatus:
    """One line of `memd status`: JSON-ready via to_dict()."""

    name: str
    state: str
    pid: int | None
    uptime: float | None  # seconds since this process was spawned
    restarts: int  # spawns after the first one
    retries: int  # fast failures in a row
    rss: int | None
    last_exit_code: int | None
    last_signal: str | None
    last_error: str | None
    next_start_in: float | None  # BACKOFF/EXITED: seconds until the next start
    log_path: str | None
    log_tail: str | None  # only when FATAL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
