"""State machine of supervised children, driven by a fake clock and fake processes."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memd.supervision.child import Child, ChildSpec, StateError
from memd.supervision.states import (
    ALL_STATES,
    IDLE_STATES,
    RUNNING_STATES,
    SIGNALLABLE_STATES,
    STOPPED_STATES,
    ProcessStates,
)
from memd.supervision.supervisor import Supervisor

S = ProcessStates


@dataclass
class FakeProc:
    """Stands in for a process: exits when told, or on the signals it obeys."""

    pid: int
    name: str
    obeys: frozenset[int] = frozenset({signal.SIGINT, signal.SIGKILL})
    returncode: int | None = None
    signals: list[int] = field(default_factory=list)
    released: bool = False
    housekeeps: int = 0

    def poll(self) -> int | None:
        return self.returncode

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.returncode is None and sig in self.obeys:
            self.returncode = 0 if sig == signal.SIGINT else -sig

    def exit(self, code: int) -> None:
        self.returncode = code

    def rss(self) -> int | None:
        return 4096

    def housekeep(self) -> None:
        self.housekeeps += 1

    def release(self) -> None:
        assert not self.released, "released twice"
        self.released = True


class FakeSpawner:
    """Spawns FakeProcs and fails the test if two processes of one child ever overlap."""

    def __init__(self) -> None:
        self.procs: list[FakeProc] = []
        self.fail_with: Exception | None = None
        self.obeys: frozenset[int] = frozenset({signal.SIGINT, signal.SIGKILL})

    def spawn(self, spec: ChildSpec) -> FakeProc:
        if self.fail_with is not None:
            raise self.fail_with
        live = [p for p in self.procs if p.name == spec.name and not p.released]
        assert not live, f"{spec.name}: spawned while pid {live[0].pid} is not reaped"
        proc = FakeProc(pid=1000 + len(self.procs), name=spec.name, obeys=self.obeys)
        self.procs.append(proc)
        return proc

    def log_tail(self, spec: ChildSpec) -> str:
        return f"last words of {spec.name}"

    def of(self, name: str) -> list[FakeProc]:
        return [p for p in self.procs if p.name == name]


class FakeClock:
    """Monotonic time that moves `auto` seconds on every read, so async waits progress."""

    def __init__(self, auto: float = 0.0) -> None:
        self.now = 0.0
        self.auto = auto

    def __call__(self) -> float:
        self.now += self.auto
        return self.now


def make_spec(**kw: object) -> ChildSpec:
    values: dict[str, object] = {
        "name": "w",
        "argv": ("prog",),
        "startsecs": 3.0,
        "startretries": 3,
        "backoff_start": 1.0,
        "backoff_cap": 60.0,
        "reset_after": 60.0,
        "stop_timeout": 10.0,
        "kill_timeout": 5.0,
    }
    values.update(kw)
    return ChildSpec(**values)  # type: ignore[arg-type]


def make_child(**kw: object) -> tuple[Child, FakeSpawner]:
    spawner = FakeSpawner()
    return Child(make_spec(**kw), spawner), spawner


def fail_fast(child: Child, spawner: FakeSpawner, at: float, code: int = 1) -> None:
    """The current process dies at `at`, before startsecs."""
    spawner.procs[-1].exit(code)
    child.step(at)


def test_state_groups_match_supervisord() -> None:
    assert len(ALL_STATES) == 8
    assert set(RUNNING_STATES) == {S.STARTING, S.RUNNING, S.BACKOFF}
    assert set(STOPPED_STATES) == {S.STOPPED, S.EXITED, S.FATAL, S.IDLE}
    assert set(SIGNALLABLE_STATES) == {S.STARTING, S.RUNNING, S.STOPPING}
    assert set(IDLE_STATES) == {S.STOPPED, S.FATAL, S.IDLE}


def test_start_counts_as_success_only_after_startsecs() -> None:
    child, spawner = make_child()
    child.start(0.0)
    assert child.state == S.STARTING and len(spawner.procs) == 1
    child.step(2.99)
    assert child.state == S.STARTING
    child.step(3.0)
    assert child.state == S.RUNNING
    assert child.retries == 0


def test_fast_failures_back_off_doubling_up_to_the_cap() -> None:
    child, spawner = make_child(startretries=100, backoff_cap=8.0)
    child.start(0.0)
    now, delays = 0.0, []
    for _ in range(6):
        now += 0.5
        fail_fast(child, spawner, now)
        assert child.state == S.BACKOFF
        assert child.next_start_at is not None
        delays.append(child.next_start_at - now)
        spawned = len(spawner.procs)
        child.step(child.next_start_at - 0.01)
        assert len(spawner.procs) == spawned, "restarted before its backoff expired"
        now = child.next_start_at
        child.step(now)
        assert child.state == S.STARTING and len(spawner.procs) == spawned + 1
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_fatal_after_startretries_fast_failures_keeps_error_and_log_tail() -> None:
    child, spawner = make_child(startretries=2)
    child.start(0.0)
    now = 0.0
    for attempt in range(3):
        now += 1.0
        fail_fast(child, spawner, now, code=3)
        if attempt < 2:
            assert child.state == S.BACKOFF
            assert child.next_start_at is not None
            now = child.next_start_at
            child.step(now)
    assert child.state == S.FATAL
    child.step(now + 10_000)
    assert len(spawner.procs) == 3, "a FATAL child must not be restarted"
    status = child.status(now)
    assert status.last_exit_code == 3
    assert status.last_error is not None and "exit code 3" in status.last_error
    assert status.log_tail == "last words of w"


def test_reset_from_fatal_gives_a_fresh_retry_budget() -> None:
    child, spawner = make_child(startretries=0)
    child.start(0.0)
    fail_fast(child, spawner, 0.5)
    assert child.state == S.FATAL
    assert child.reset() is True
    assert child.state == S.STOPPED
    child.start(1.0)
    assert child.state == S.STARTING and child.retries == 0
    child.step(4.0)
    assert child.state == S.RUNNING
    assert child.reset() is False, "reset only applies to FATAL"


def test_stop_during_backoff_goes_straight_to_stopped() -> None:
    child, spawner = make_child()
    child.start(0.0)
    fail_fast(child, spawner, 0.5)
    assert child.state == S.BACKOFF
    child.stop(0.6)
    assert child.state == S.STOPPED
    child.step(1_000.0)
    assert len(spawner.procs) == 1 and spawner.procs[0].signals == []


def test_graceful_stop_sends_stop_signal_and_waits_for_exit() -> None:
    child, spawner = make_child()
    child.start(0.0)
    child.step(3.0)
    child.stop(5.0)
    assert child.state == S.STOPPING
    assert spawner.procs[0].signals == [signal.SIGINT]
    child.step(5.1)
    assert child.state == S.STOPPED
    assert child.last_exit is not None and child.last_exit.code == 0
    assert spawner.procs[0].released


def test_stopping_escalates_to_sigkill_after_stop_timeout() -> None:
    child, spawner = make_child(stop_signal=signal.SIGTERM)
    spawner.obeys = frozenset({signal.SIGKILL})
    child.start(0.0)
    child.step(3.0)
    child.stop(100.0)
    proc = spawner.procs[0]
    child.step(109.99)
    assert proc.signals == [signal.SIGTERM] and child.state == S.STOPPING
    child.step(110.0)
    assert proc.signals == [signal.SIGTERM, signal.SIGKILL]
    child.step(110.1)
    assert child.state == S.STOPPED
    assert child.last_exit is not None and child.last_exit.signal_name == "SIGKILL"


def test_unkillable_child_is_abandoned_after_kill_timeout() -> None:
    child, spawner = make_child(stop_timeout=1.0, kill_timeout=2.0)
    spawner.obeys = frozenset()
    child.start(0.0)
    child.step(3.0)
    child.stop(3.0)
    child.step(4.0)  # SIGKILL
    child.step(5.99)
    assert child.state == S.STOPPING
    child.step(6.0)
    assert child.state == S.STOPPED
    assert child.last_error == "did not exit after SIGKILL"
    assert not spawner.procs[0].released, "its pidfile must stay for the next start's reaping"


@pytest.mark.parametrize(
    ("ran_for", "expected_delay"),
    [(10.0, 8.0), (59.9, 8.0), (60.0, 1.0), (3_600.0, 1.0)],
)
def test_healthy_run_of_reset_after_resets_the_backoff(
    ran_for: float,
    expected_delay: float,
) -> None:
    child, spawner = make_child(startretries=5)
    child.start(0.0)
    now = 0.0
    for _ in range(3):  # delays 1, 2, 4 used up; the next would be 8
        fail_fast(child, spawner, now + 0.5)
        assert child.next_start_at is not None
        now = child.next_start_at
        child.step(now)
    child.step(now + 3.0)
    assert child.state == S.RUNNING and child.retries == 0
    running_since = now + 3.0
    child.step(running_since + ran_for / 2)
    spawner.procs[-1].exit(0)
    child.step(running_since + ran_for)
    assert child.state == S.EXITED
    assert child.next_start_at == pytest.approx(running_since + ran_for + expected_delay)


def test_restart_at_once_after_a_healthy_run_then_the_backoff_resumes() -> None:
    """The first exit after RUNNING restarts in the same tick; the next one waits
    backoff_start and doubles; a run of reset_after re-arms the immediate restart, and a
    fast failure disarms it."""
    child, spawner = make_child(restart_at_once=True, startsecs=0.0, reset_after=60.0)
    child.start(0.0)
    child.step(0.0)
    assert child.state == S.RUNNING
    spawner.procs[-1].exit(-9)
    child.step(100.0)
    assert child.state == S.STARTING and len(spawner.procs) == 2, "not restarted at once"
    child.step(100.0)
    spawner.procs[-1].exit(1)
    child.step(101.0)
    assert child.state == S.EXITED and child.next_start_at == pytest.approx(102.0)
    child.step(102.0)
    child.step(102.0)
    spawner.procs[-1].exit(1)
    child.step(103.0)
    assert child.next_start_at == pytest.approx(105.0), "the doubling goes on"
    child.step(105.0)
    child.step(105.0)
    child.step(165.0)  # up reset_after seconds: re-armed
    spawner.procs[-1].exit(1)
    child.step(166.0)
    assert child.state == S.STARTING and len(spawner.procs) == 5
    spawner.procs[-1].exit(1)  # a fast failure: BACKOFF, and no immediate restart after
    child.step(166.0)
    assert child.state == S.BACKOFF and not child.at_once
    assert child.next_start_at == pytest.approx(167.0)


def test_without_restart_at_once_an_exit_waits_backoff_start() -> None:
    child, spawner = make_child(startsecs=0.0)
    child.start(0.0)
    child.step(0.0)
    spawner.procs[-1].exit(-9)
    child.step(100.0)
    assert child.state == S.EXITED and child.next_start_at == pytest.approx(101.0)


def test_exits_after_running_restart_forever_and_never_go_fatal() -> None:
    child, spawner = make_child(startretries=0, backoff_cap=4.0)
    child.start(0.0)
    now = 0.0
    for _ in range(10):
        child.step(now + 3.0)
        assert child.state == S.RUNNING
        spawner.procs[-1].exit(1)
        child.step(now + 5.0)
        assert child.state == S.EXITED
        assert child.next_start_at is not None
        now = child.next_start_at
        child.step(now)
        assert child.state == S.STARTING
    assert child.status(now).restarts == 10


def test_spawn_error_is_a_fast_failure() -> None:
    child, spawner = make_child(startretries=1)
    spawner.fail_with = FileNotFoundError("'memsearch' not found on PATH")
    child.start(0.0)
    assert child.state == S.BACKOFF
    assert child.last_error is not None and "not found" in child.last_error
    child.step(1.0)
    assert child.state == S.FATAL


def test_running_requires_readiness_and_unready_child_is_killed_after_ready_timeout() -> None:
    ready = {"ok": False}
    child, spawner = make_child(ready=lambda: ready["ok"], ready_timeout=20.0)
    child.start(0.0)
    child.step(10.0)
    assert child.state == S.STARTING
    child.step(20.0)
    assert spawner.procs[0].signals == [signal.SIGKILL]
    assert child.last_error == "not ready after 20.0s"
    child.step(20.1)
    assert child.state == S.BACKOFF and child.retries == 1
    assert child.last_error == "not ready after 20.0s"
    assert child.next_start_at is not None
    respawn_at = child.next_start_at
    child.step(respawn_at)
    assert child.state == S.STARTING
    ready["ok"] = True
    child.step(respawn_at + 3.0)
    assert child.state == S.RUNNING


def test_a_raising_readiness_check_means_not_ready() -> None:
    def probe() -> bool:
        raise ConnectionRefusedError("no socket yet")

    child, _ = make_child(ready=probe)
    child.start(0.0)
    child.step(5.0)
    assert child.state == S.STARTING


def test_housekeeping_runs_periodically_while_running() -> None:
    child, spawner = make_child()
    child.start(0.0)
    for t in range(3, 60):
        child.step(float(t))
    assert 4 <= spawner.procs[0].housekeeps <= 6


def test_spec_is_validated_and_equality_ignores_the_readiness_callable() -> None:
    with pytest.raises(ValueError):
        ChildSpec(name="x", argv=())
    with pytest.raises(ValueError):
        ChildSpec(name="x", argv=("a",), backoff_start=5.0, backoff_cap=1.0)
    with pytest.raises(ValueError):
        ChildSpec(name="x", argv=("a",), backoff_start=0.0)
    a = ChildSpec(name="x", argv=["a", "b"], env={"K": "v"}, ready=lambda: True)
    b = ChildSpec(name="x", argv=("a", "b"), env={"K": "v"}, ready=lambda: True)
    assert a == b and a.argv == ("a", "b")
    with pytest.raises(TypeError):
        a.env["K"] = "w"  # type: ignore[index]


# -- random operation sequences: the machine never breaks its own rules ------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=30.0)),
        st.tuples(
            st.sampled_from(["start", "stop", "kill", "reset", "step", "toggle_ready"]),
            st.just(0.0),
        ),
        st.tuples(st.just("exit"), st.integers(min_value=-15, max_value=3).map(float)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, obeys_sigint=st.booleans())
def test_random_operations_keep_the_invariants(
    ops: list[tuple[str, float]],
    obeys_sigint: bool,
) -> None:
    ready = {"ok": True}
    child, spawner = make_child(startretries=2, ready=lambda: ready["ok"], ready_timeout=20.0)
    if not obeys_sigint:
        spawner.obeys = frozenset({signal.SIGKILL})
    now = 0.0
    for op, arg in ops:
        spawns_before = len(spawner.procs)
        state_before = child.state
        if op == "advance":
            now += arg
            child.step(now)
        elif op == "exit":
            if spawner.procs and not spawner.procs[-1].released:
                spawner.procs[-1].exit(int(arg))
        elif op == "toggle_ready":
            ready["ok"] = not ready["ok"]
        elif op == "reset":
            child.reset()
        else:
            getattr(child, op)(now)
        assert child.state in ALL_STATES
        assert (child.proc is not None) == (child.state in SIGNALLABLE_STATES)
        if state_before in (S.FATAL, S.STOPPED, S.STOPPING) and op != "start":
            assert len(spawner.procs) == spawns_before
    child.stop(now)
    for _ in range(4):
        now += 10.0
        child.step(now)
    assert child.idle


def test_change_state_rejects_disallowed_transitions() -> None:
    child, _ = make_child()
    with pytest.raises(StateError):
        child._change_state(S.RUNNING)  # STOPPED -> RUNNING skips STARTING


# -- Supervisor: several children, requirements, async stop and shutdown -----------------


def make_supervisor(auto: float = 0.1) -> tuple[Supervisor, FakeSpawner, FakeClock]:
    spawner, clock = FakeSpawner(), FakeClock(auto)
    return Supervisor(spawner=spawner, clock=clock, tick=0.0, poll=0.0), spawner, clock


def test_dependent_child_starts_only_once_its_requirement_is_running() -> None:
    sup, spawner, _ = make_supervisor(auto=0.0)
    index_ready = {"ok": False}
    sup.add(make_spec(name="index", startsecs=1.0, ready=lambda: index_ready["ok"]))
    sup.add(make_spec(name="watch"), requires=["index"])
    sup.step(0.0)
    sup.step(5.0)
    assert spawner.of("index") and not spawner.of("watch")
    index_ready["ok"] = True
    sup.step(6.0)
    assert sup.is_ready("index")
    sup.step(6.0)
    assert len(spawner.of("watch")) == 1
    # The index dies: a watcher crash now waits for it instead of burning its retries.
    spawner.of("index")[-1].exit(1)
    spawner.of("watch")[-1].exit(1)
    sup.step(7.0)
    index_ready["ok"] = False
    for t in (8.0, 9.0, 20.0, 40.0):
        sup.step(t)
    assert len(spawner.of("watch")) == 1
    assert sup.child("watch").state == S.BACKOFF
    index_ready["ok"] = True
    sup.step(41.0)
    sup.step(41.0)
    assert len(spawner.of("watch")) == 2


def test_gate_holds_back_starts_and_restarts_but_is_not_asked_while_running() -> None:
    """memd's shared index server gates each watcher on its own client's socket."""
    sup, spawner, _ = make_supervisor(auto=0.0)
    asked: list[bool] = []
    serving = {"ok": False}

    def gate() -> bool:
        asked.append(serving["ok"])
        return serving["ok"]

    sup.add(make_spec(name="watch", startsecs=0.0), gate=gate)
    sup.step(0.0)
    sup.step(1.0)
    assert not spawner.of("watch") and asked
    serving["ok"] = True
    sup.step(2.0)
    sup.step(2.0)
    assert sup.is_ready("watch")
    asked.clear()
    for t in (3.0, 4.0, 5.0):
        sup.step(t)
    assert not asked  # a RUNNING child's gate is not polled
    serving["ok"] = False
    spawner.of("watch")[-1].exit(1)
    for t in (6.0, 7.0, 20.0):
        sup.step(t)
    assert len(spawner.of("watch")) == 1 and sup.child("watch").state == S.EXITED
    serving["ok"] = True
    sup.step(21.0)
    assert len(spawner.of("watch")) == 2


def test_preferred_child_is_waited_for_only_until_it_first_runs_or_fails() -> None:
    """The zygote is preferred: children wait for its first start (bounded), never for
    its restarts, and not at all once it has failed."""
    spawner, clock = FakeSpawner(), FakeClock(0.0)
    sup = Supervisor(spawner=spawner, clock=clock, tick=0.0, poll=0.0, prefer_wait=10.0)
    zygote_up = {"ok": False}
    sup.add(make_spec(name="zygote", startsecs=0.5, ready=lambda: zygote_up["ok"]))
    sup.add(make_spec(name="a", startsecs=1.0), prefers=["zygote"])
    for t in (0.0, 1.0, 2.0):
        sup.step(t)
    assert spawner.of("zygote") and not spawner.of("a")
    zygote_up["ok"] = True
    sup.step(3.0)
    sup.step(3.0)
    assert len(spawner.of("a")) == 1
    # Its restart is not waited for: "a" dies too and comes back while the zygote is down.
    spawner.of("zygote")[-1].exit(1)
    spawner.of("a")[-1].exit(1)
    for t in (5.0, 6.5, 8.0):
        sup.step(t)
    assert len(spawner.of("a")) == 2
    # A zygote that fails before it first ran holds nobody back ...
    clock.now = 9.0  # when they are added: prefer_wait counts from there
    sup.add(make_spec(name="z2", startsecs=5.0))
    sup.add(make_spec(name="b"), prefers=["z2"])
    sup.step(9.0)
    assert not spawner.of("b")
    spawner.of("z2")[-1].exit(1)
    sup.step(9.5)
    sup.step(9.5)
    assert sup.child("z2").state == S.BACKOFF and len(spawner.of("b")) == 1
    # ... and one that takes too long is waited for only prefer_wait seconds.
    clock.now = 10.0
    sup.add(make_spec(name="z3", startsecs=100.0))
    sup.add(make_spec(name="c"), prefers=["z3"])
    sup.step(10.0)
    sup.step(19.0)
    assert not spawner.of("c")
    sup.step(20.5)
    assert len(spawner.of("c")) == 1


def test_async_restart_never_overlaps_old_and_new_process() -> None:
    sup, spawner, _ = make_supervisor()
    spawner.obeys = frozenset({signal.SIGKILL})  # ignores SIGINT: restart must wait for SIGKILL
    sup.add(make_spec(name="w", stop_timeout=2.0))

    async def scenario() -> None:
        assert await sup.wait_ready("w", timeout=10.0)
        assert await sup.restart("w")
        sup.step()  # FakeSpawner fails this test if the new one overlaps the old one
        assert await sup.wait_ready("w", timeout=10.0)

    asyncio.run(scenario())
    first, second = spawner.procs
    assert first.signals == [signal.SIGINT, signal.SIGKILL] and first.released
    assert not second.released


def test_async_stop_is_bounded_by_timeout() -> None:
    sup, spawner, _ = make_supervisor()
    spawner.obeys = frozenset()
    sup.add(make_spec(name="w", stop_timeout=1_000.0))
    sup.step()
    assert asyncio.run(sup.stop("w", timeout=5.0)) is False
    assert sup.child("w").state == S.STOPPING


def test_shutdown_stops_all_in_parallel_and_kills_what_lingers() -> None:
    sup, spawner, clock = make_supervisor()
    for name in ("a", "b", "c"):
        sup.add(make_spec(name=name, stop_timeout=1_000.0))
    spawner.obeys = frozenset({signal.SIGKILL})
    sup.step()
    spawner.obeys = frozenset({signal.SIGINT, signal.SIGKILL})
    spawner.procs[0].obeys = frozenset({signal.SIGINT, signal.SIGKILL})  # only "a" obeys SIGINT
    started = clock.now
    assert asyncio.run(sup.shutdown(timeout=8.0)) is True
    assert clock.now - started <= 8.0 + 1.0
    assert all(sup.child(n).state == S.STOPPED for n in ("a", "b", "c"))
    a, b, c = spawner.procs
    assert a.signals == [signal.SIGINT]
    assert b.signals == c.signals == [signal.SIGINT, signal.SIGKILL]
    sup.step()
    assert len(spawner.procs) == 3, "nothing restarts after shutdown"


def test_shutdown_reports_a_child_that_survives_sigkill() -> None:
    sup, spawner, _ = make_supervisor()
    spawner.obeys = frozenset()
    sup.add(make_spec(name="w", kill_timeout=1_000.0))
    sup.step()
    assert asyncio.run(sup.shutdown(timeout=4.0)) is False


def test_run_loop_ticks_until_shutdown() -> None:
    sup, _, _ = make_supervisor()
    sup.add(make_spec(name="w"))

    async def scenario() -> None:
        runner = asyncio.create_task(sup.run())
        while not sup.is_ready("w"):
            await asyncio.sleep(0)
        assert await sup.shutdown(timeout=5.0)
        await asyncio.wait_for(runner, timeout=5.0)

    asyncio.run(scenario())
    assert sup.child("w").state == S.STOPPED


def test_idle_run_loop_wakes_on_a_child_exit_and_on_start() -> None:
    """Real processes, real pidfds: with a long idle tick, an exit is seen at once."""
    import subprocess
    import sys
    import time

    from memd.supervision.procs import PopenSpawner

    sup = Supervisor(spawner=PopenSpawner(), tick=0.05, poll=0.05, idle_tick=3600.0)
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    sup.add(ChildSpec(name="w", argv=sleeper, startsecs=0.0, restart_at_once=True))

    async def until(predicate: object, bound: float = 30.0) -> None:
        deadline = time.monotonic() + bound
        while not predicate():  # type: ignore[operator]
            assert time.monotonic() < deadline, "not within the bound"
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        runner = asyncio.create_task(sup.run())
        await until(lambda: sup.is_ready("w"))
        first = sup.child("w").proc
        assert first is not None
        subprocess.run(["kill", "-9", str(first.pid)], check=True)
        await until(lambda: sup.is_ready("w") and sup.child("w").proc is not first)
        sup.add(ChildSpec(name="v", argv=sleeper, startsecs=0.0))
        await until(lambda: sup.is_ready("v"))
        assert await sup.shutdown(timeout=10.0)
        await asyncio.wait_for(runner, timeout=5.0)

    asyncio.run(scenario())
    assert sup.child("w").status(0.0).restarts == 1


def test_reset_remove_replace_and_status() -> None:
    sup, spawner, _ = make_supervisor(auto=0.0)
    sup.add(make_spec(name="w", startretries=0))
    sup.add(make_spec(name="idle"), start=False)
    sup.step(0.0)
    spawner.of("w")[0].exit(2)
    sup.step(0.5)
    status = sup.status()
    assert status["w"].state == S.FATAL and status["w"].log_tail == "last words of w"
    assert status["idle"].state == S.STOPPED and not spawner.of("idle")
    assert sup.reset("w")
    sup.step(1.0)
    sup.step(4.0)
    status = sup.status()["w"]
    assert status.state == S.RUNNING and status.restarts == 1 and status.log_tail is None
    assert status.pid == spawner.of("w")[-1].pid and status.rss == 4096
    assert status.last_exit_code == 2
    assert set(status.to_dict()) >= {"state", "pid", "uptime", "restarts", "rss", "last_error"}

    async def swap() -> None:
        same = await sup.replace(make_spec(name="w", startretries=0, ready=lambda: True))
        assert same is sup.child("w") and same.state == S.RUNNING
        await sup.replace(make_spec(name="w", argv=("prog", "--new")))
        assert sup.child("w").spec.argv == ("prog", "--new")
        assert await sup.remove("idle")

    asyncio.run(swap())
    assert "idle" not in sup and spawner.of("w")[-2].released
    sup.step(10.0)
    assert len(spawner.of("w")) == 3


def test_a_busy_starting_child_is_not_killed_while_its_progress_moves() -> None:
    """Issue 24: a watcher indexing a 35 MB session missed readiness for 60 s three times
    and went FATAL for good. A child whose progress probe keeps changing is starting, not
    stuck; one whose progress stops is killed ready_timeout after its last change."""
    work = {"done": 0}
    child, spawner = make_child(
        ready=lambda: False, ready_timeout=20.0, progress=lambda pid: work["done"]
    )
    child.start(0.0)
    for t in range(1, 200):  # 200 s of work, ten times ready_timeout
        work["done"] += 1
        child.step(float(t))
        assert child.state == S.STARTING, t
    assert spawner.procs[0].signals == []
    child.step(218.5)  # no progress since t=199
    assert child.state == S.STARTING and spawner.procs[0].signals == []
    child.step(219.0)
    assert spawner.procs[0].signals == [signal.SIGKILL]
    assert child.last_error is not None and child.last_error.startswith("not ready after 219")


def test_a_child_with_no_progress_is_killed_after_ready_timeout_as_before() -> None:
    child, spawner = make_child(ready=lambda: False, ready_timeout=20.0, progress=lambda pid: 7)
    child.start(0.0)
    child.step(10.0)
    assert child.state == S.STARTING
    child.step(20.0)
    assert spawner.procs[0].signals == [signal.SIGKILL]


def test_a_fatal_child_with_a_retry_period_is_started_again_after_it() -> None:
    """Issue 24: a watcher that went FATAL stopped its client's indexing for good. With
    fatal_retry_after, FATAL is a long pause, not the end; without it, it stays FATAL."""
    for retry_after, expect_again in ((600.0, True), (0.0, False)):
        sup, spawner, _ = make_supervisor(auto=0.0)
        sup.add(make_spec(startretries=0, fatal_retry_after=retry_after))
        sup.step(0.0)
        spawner.procs[-1].exit(1)
        sup.step(0.5)
        assert sup.status()["w"].state == S.FATAL
        sup.step(599.0)
        assert sup.status()["w"].state == S.FATAL and len(spawner.procs) == 1
        sup.step(600.5)
        sup.step(600.6)
        assert (sup.status()["w"].state == S.STARTING) is expect_again, retry_after
        assert len(spawner.procs) == (2 if expect_again else 1)
