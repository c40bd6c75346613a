"""One supervised program: its immutable spec and its state machine with backoff.

The model is supervisord's Subprocess (`supervisor/process.py`): states from
`memd.supervision.states`, one method that changes state (`_change_state`), backoff kept as data on
the child, and one `step(now)` per tick that makes every timing decision. OS effects go
through a `Spawner`/`Proc` seam (`memd.supervision.procs` for real), so tests drive it with a fake
clock and fake processes.

Lifecycle (what `step` does):

    STOPPED --start--> STARTING --up startsecs and ready--> RUNNING
    STARTING --exits (fast failure)--> BACKOFF --after delay--> STARTING
    BACKOFF --more than startretries fast failures in a row--> FATAL --reset--> STOPPED
    RUNNING --exits--> EXITED --after delay--> STARTING
    STARTING/RUNNING --stop--> STOPPING --exits--> STOPPED
    STOPPING --stop_timeout--> SIGKILL to the group --exits--> STOPPED
    BACKOFF/EXITED --stop--> STOPPED
    RUNNING --park--> STOPPING --exits--> IDLE --start--> STARTING   (on demand)
    IDLE --stop--> STOPPED

The restart delay starts at backoff_start, doubles after every failure (fast or not) up to
backoff_cap, and goes back to backoff_start once the child has been RUNNING for
reset_after seconds. The fast-failure count (`retries`) resets on reaching RUNNING.

With `restart_at_once`, the first exit after a start, a reset, or a run of reset_after
seconds is restarted in the same tick instead of after backoff_start, whether it came while
RUNNING or while still STARTING (a fast failure: it still counts against startretries);
the exit after that waits backoff_start and the doubling goes on as above. That is at most
one immediate restart per start, reset or reset_after seconds up, so it is no tight loop: a
watcher killed after hours of work, or killed in its start-up scan, comes back in a
fraction of a second; a crash-looping one still backs off and still goes FATAL after the
same number of tries.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import structlog

from memd.supervision.childlogs import redact_argv
from memd.supervision.spec import ChildSpec, ChildStatus, ExitInfo, Proc, Spawner, Transition
from memd.supervision.states import IDLE_STATES, SIGNALLABLE_STATES, WAITING_STATES, ProcessStates

log = structlog.get_logger()

S = ProcessStates
HOUSEKEEP_EVERY = 10.0  # seconds between log-size checks of a live child

# new state -> the states it may be entered from
_ALLOWED_FROM: dict[str, frozenset[str]] = {
    S.STARTING: frozenset((S.STOPPED, S.BACKOFF, S.EXITED, S.IDLE)),
    S.RUNNING: frozenset((S.STARTING,)),
    S.BACKOFF: frozenset((S.STARTING,)),
    S.STOPPING: frozenset((S.STARTING, S.RUNNING)),
    S.EXITED: frozenset((S.RUNNING,)),
    S.STOPPED: frozenset((S.STOPPING, S.BACKOFF, S.EXITED, S.FATAL, S.IDLE)),
    S.FATAL: frozenset((S.BACKOFF,)),
    S.IDLE: frozenset((S.STOPPING,)),
}


class StateError(RuntimeError):
    """A transition the state machine does not allow: a bug in the caller or in memd."""


class Child:
    """The state machine of one supervised program (single-threaded: the event loop)."""

    def __init__(self, spec: ChildSpec, spawner: Spawner) -> None:
        self.spec = spec
        self._spawner = spawner
        self.state: str = S.STOPPED
        self.proc: Proc | None = None
        self.spawned_at: float | None = None
        self._progress: tuple[object, float] | None = None
        self._slow_logged = False
        self._fatal_at: float | None = None  # when a FATAL with fatal_retry_after began
        self.running_since: float | None = None
        self.next_start_at: float | None = None
        self.stop_deadline: float | None = None
        self.killed_at: float | None = None
        self.delay = spec.backoff_start
        self.at_once = spec.restart_at_once  # the next exit after RUNNING restarts at once
        self.retries = 0
        self.starts = 0
        self.last_exit: ExitInfo | None = None
        self.last_error: str | None = None
        self.log_tail = ""
        self._next_housekeep = 0.0
        self._log = log.bind(name=spec.name)
        self.parking = False  # the STOPPING under way ends in IDLE, not STOPPED
        # Told of every state change, synchronously on the loop thread (the supervisor's
        # listeners): it must be cheap and must not change this child's state itself.
        self.on_change: Callable[[Transition], None] | None = None

    # -- the one place a state changes --------------------------------------------------

    def _change_state(self, new: str) -> None:
        old = self.state
        if old not in _ALLOWED_FROM[new]:
            raise StateError(f"{self.spec.name}: {old} -> {new} is not allowed")
        self.state = new
        pid = self.proc.pid if self.proc is not None else None
        level = self._log.error if new == S.FATAL else self._log.info
        level("child state", pid=pid, **{"from": old, "to": new})
        if self.on_change is not None:
            self.on_change(Transition(self.spec.name, old, new, pid))

    # -- commands -----------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Spawn from STOPPED or IDLE with a fresh retry budget; no-op in any other state."""
        if self.state not in (S.STOPPED, S.IDLE):
            return
        self.retries = 0
        self._healthy()
        self._spawn(now)

    def stop(self, now: float) -> None:
        """Polite stop: stop_signal to the group, SIGKILL after stop_timeout (in step)."""
        if self.state in (S.STARTING, S.RUNNING):
            assert self.proc is not None
            self.proc.signal(self.spec.stop_signal)
            self.stop_deadline = now + self.spec.stop_timeout
            self._change_state(S.STOPPING)
        elif self.state in WAITING_STATES:
            self.next_start_at = None
            self._change_state(S.STOPPED)
        elif self.state == S.IDLE:
            self._change_state(S.STOPPED)
        self.parking = False  # an explicit stop wins over a park under way

    def park(self, now: float) -> bool:
        """Stop a RUNNING child because its work is idle: it ends IDLE (not a failure, no
        backoff) and start() brings it back. False (nothing done) in any other state: a
        starting or failing child keeps its own rules."""
        if self.state != S.RUNNING:
            return False
        self.stop(now)
        self.parking = True
        return True

    def kill(self, now: float) -> None:
        """Stop now: SIGKILL to the group (used when a shutdown runs out of time)."""
        self.stop(now)
        if self.state == S.STOPPING and self.killed_at is None:
            self._sigkill(now)

    def reset(self) -> bool:
        """FATAL -> STOPPED with a fresh retry budget, so it can be started again."""
        if self.state != S.FATAL:
            return False
        self.retries = 0
        self._healthy()
        self.log_tail = ""
        self._fatal_at = None
        self._change_state(S.STOPPED)
        return True

    def settled(self, wanted: bool) -> bool:
        """Whether a tick has nothing to move on for it but log housekeeping and a backoff
        (which sets its own time): RUNNING, waiting for a command (parked, stopped, FATAL
        for good) or in backoff. A wanted child that waits to start is not: its
        requirements, gate and preferences are looked at again every idle tick."""
        if self.state == S.FATAL:
            return self.spec.fatal_retry_after <= 0
        if self.state in (S.STOPPED, S.IDLE):
            return not wanted
        return self.state in (S.RUNNING, *WAITING_STATES)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing will until start() or reset()."""
        return self.state in IDLE_STATES

    # -- the tick -------------------------------------------------------------------------

    def step(self, now: float, *, can_spawn: bool = True) -> None:
        """Make every timing decision for this tick. can_spawn=False holds back (re)starts
        (the supervisor passes it while a required child is not RUNNING)."""
        if self.state in SIGNALLABLE_STATES:
            assert self.proc is not None
            returncode = self.proc.poll()
            if returncode is not None:
                self._exited(now, ExitInfo.from_returncode(returncode))
        if self.state == S.STARTING:
            self._check_started(now)
        elif self.state == S.RUNNING:
            self._check_running(now)
        elif self.state == S.STOPPING:
            self._check_stopping(now)
        elif self.state == S.FATAL and self.spec.fatal_retry_after > 0:
            self._fatal_at = self._fatal_at if self._fatal_at is not None else now
            if now - self._fatal_at >= self.spec.fatal_retry_after:
                self._log.warning("child.fatal_retried", after=self.spec.fatal_retry_after)
                self.reset()  # STOPPED: the supervisor starts it again if still wanted
        if self.state in WAITING_STATES and can_spawn:
            assert self.next_start_at is not None
            if now >= self.next_start_at:
                self._spawn(now)

    def _spawn(self, now: float) -> None:
        self._change_state(S.STARTING)
        self.starts += 1
        self.spawned_at = now
        self.running_since = self.next_start_at = self.stop_deadline = self.killed_at = None
        self._next_housekeep = now + HOUSEKEEP_EVERY
        self._progress = None  # (last value of spec.progress, when it changed)
        self._slow_logged = False
        try:
            self.proc = self._spawner.spawn(self.spec)
        except Exception as exc:  # whatever the seam raises is a failed start
            self.last_error = f"spawn failed: {exc}"
            self._log.warning("child.spawn_failed", error=str(exc))
            self._fast_failure(now)
            return
        self._log.info("child.spawned", pid=self.proc.pid, argv=redact_argv(self.spec.argv))

    def _check_started(self, now: float) -> None:
        assert self.spawned_at is not None
        if self.killed_at is not None:
            self._check_killed(now)
            return
        up = now - self.spawned_at
        if up < self.spec.startsecs:
            return
        if self._is_ready():
            self.running_since = now
            self.retries = 0
            self._change_state(S.RUNNING)
        elif self._progressing(now):
            return
        elif up >= self.spec.ready_timeout:
            self.last_error = f"not ready after {up:.1f}s"
            self._log.warning("child.not_ready", up=round(up, 1))
            self._sigkill(now)

    def _check_running(self, now: float) -> None:
        assert self.running_since is not None
        if now - self.running_since >= self.spec.reset_after:
            self._healthy()
        self._housekeep(now)

    def _check_stopping(self, now: float) -> None:
        assert self.stop_deadline is not None
        if self.killed_at is not None:
            self._check_killed(now)
        elif now >= self.stop_deadline:
            self._log.warning("child.stop_escalated")
            self._sigkill(now)

    def _check_killed(self, now: float) -> None:
        """SIGKILLed but not reaped after kill_timeout: stop waiting for it (bounded)."""
        assert self.killed_at is not None and self.proc is not None
        if now - self.killed_at < self.spec.kill_timeout:
            return
        self._log.error("child.abandoned", pid=self.proc.pid)
        self.last_error = "did not exit after SIGKILL"
        self.proc = None  # its pidfile stays, so the next memd start reaps it
        if self.state == S.STOPPING:
            self._stopped()
        else:
            self._fast_failure(now)

    def _sigkill(self, now: float) -> None:
        assert self.proc is not None
        self.proc.signal(signal.SIGKILL)
        self.killed_at = now

    def _exited(self, now: float, info: ExitInfo) -> None:
        assert self.proc is not None
        self.last_exit = info
        emit = self._log.info if self.state == S.STOPPING else self._log.warning
        emit("child exited", pid=self.proc.pid, code=info.code, signal=info.signal_name)
        self.proc.release()
        if self.state == S.STOPPING:
            self._stopped()
        elif self.state == S.STARTING:
            if self.killed_at is None:
                self.last_error = f"{info} while starting"
            self._fast_failure(now)
        else:
            assert self.running_since is not None
            self.last_error = f"{info} after {now - self.running_since:.1f}s running"
            self.log_tail = self._spawner.log_tail(self.spec)
            if now - self.running_since >= self.spec.reset_after:
                self._healthy()
            self._change_state(S.EXITED)
            self._schedule(now, at_once=self.at_once)
        self.proc = None  # after the transitions, so their log lines still carry the pid

    def _stopped(self) -> None:
        self._change_state(S.IDLE if self.parking else S.STOPPED)
        self.parking = False

    def _fast_failure(self, now: float) -> None:
        self.retries += 1
        # The first exit since a start, reset or healthy run is retried at once (a kill -9
        # during the start-up scan); re-armed only by those, so a crash loop backs off.
        at_once, self.at_once = self.at_once, False
        self.log_tail = self._spawner.log_tail(self.spec)
        self._change_state(S.BACKOFF)
        if self.retries > self.spec.startretries:
            self.next_start_at = None
            self._change_state(S.FATAL)
        else:
            self._schedule(now, at_once=at_once)

    def _healthy(self) -> None:  # a start, a reset, up reset_after s: the backoff is afresh
        self.delay = self.spec.backoff_start
        self.at_once = self.spec.restart_at_once

    def _schedule(self, now: float, at_once: bool = False) -> None:
        if at_once:
            self.at_once, self.next_start_at = False, now
            return
        self.next_start_at = now + self.delay
        self.delay = min(self.delay * 2, self.spec.backoff_cap)

    def _progressing(self, now: float) -> bool:
        """Whether the starting child's progress probe changed within ready_timeout
        (sampled every tick; the first sample counts from the spawn)."""
        if self.spec.progress is None or self.proc is None or self.spawned_at is None:
            return False
        try:
            value = self.spec.progress(self.proc.pid)
        except Exception:  # a failing probe shows no progress
            value = None
        if self._progress is None:
            self._progress = (value, self.spawned_at)
        elif value is not None and value != self._progress[0]:
            self._progress = (value, now)
        busy = now - self._progress[1] < self.spec.ready_timeout
        if busy and now - self.spawned_at >= self.spec.ready_timeout and not self._slow_logged:
            self._slow_logged = True
            self._log.info("child.still_starting", up=round(now - self.spawned_at, 1))
        return busy

    def _is_ready(self) -> bool:
        if self.spec.ready is None:
            return True
        try:
            return bool(self.spec.ready())
        except Exception as exc:  # a failing probe means "not ready yet"
            self._log.debug("child.ready_check_failed", error=str(exc))
            return False

    def _housekeep(self, now: float) -> None:
        if now < self._next_housekeep or self.proc is None:
            return
        self._next_housekeep = now + HOUSEKEEP_EVERY
        try:
            self.proc.housekeep()
        except OSError as exc:
            self._log.warning("compaction.housekeeping_failed", error=str(exc))

    # -- status ---------------------------------------------------------------------------

    def status(self, now: float) -> ChildStatus:
        proc = self.proc
        exit_info = self.last_exit
        return ChildStatus(
            name=self.spec.name,
            state=self.state,
            pid=proc.pid if proc is not None else None,
            uptime=(
                now - self.spawned_at if proc is not None and self.spawned_at is not None else None
            ),
            restarts=max(self.starts - 1, 0),
            retries=self.retries,
            rss=proc.rss() if proc is not None else None,
            last_exit_code=exit_info.code if exit_info else None,
            last_signal=exit_info.signal_name if exit_info else None,
            last_error=self.last_error,
            next_start_in=(
                max(self.next_start_at - now, 0.0) if self.next_start_at is not None else None
            ),
            log_path=str(self.spec.log_path) if self.spec.log_path else None,
            log_tail=self.log_tail if self.state == S.FATAL else None,
        )
