"""IDLE: a child stopped on purpose because its work is idle, started again on demand."""

from __future__ import annotations

import asyncio

from memd.supervision.child import Child
from memd.supervision.states import IDLE_STATES, RUNNING_STATES, STOPPED_STATES, ProcessStates
from memd.supervision.supervisor import Supervisor
from tests.test_supervisor import FakeClock, FakeSpawner, make_child, make_spec

S = ProcessStates


def running(**kw: object) -> tuple[Child, FakeSpawner]:
    child, spawner = make_child(**kw)
    child.start(0.0)
    child.step(3.0)
    assert child.state == S.RUNNING
    return child, spawner


def test_idle_is_a_stopped_state_not_a_running_or_failed_one() -> None:
    assert S.IDLE in STOPPED_STATES and S.IDLE in IDLE_STATES
    assert S.IDLE not in RUNNING_STATES


def test_park_stops_politely_and_ends_idle_without_backoff() -> None:
    child, spawner = running()
    assert child.park(10.0)
    assert child.state == S.STOPPING
    child.step(10.5)  # the SIGINT made the fake exit
    assert child.state == S.IDLE
    assert child.retries == 0 and child.next_start_at is None
    child.step(1000.0)  # nothing happens by itself: no backoff restart, no FATAL
    assert child.state == S.IDLE and len(spawner.procs) == 1


def test_start_from_idle_spawns_with_a_fresh_budget() -> None:
    child, spawner = running()
    child.park(10.0)
    child.step(10.5)
    child.start(20.0)
    assert child.state == S.STARTING and len(spawner.procs) == 2
    child.step(23.0)
    assert child.state == S.RUNNING


def test_park_escalates_to_sigkill_and_still_ends_idle() -> None:
    child, spawner = running()
    spawner.procs[-1].obeys = frozenset({9})
    child.park(10.0)
    child.step(15.0)
    assert child.state == S.STOPPING
    child.step(20.0)  # stop_timeout 10 s passed: SIGKILL
    child.step(20.1)
    assert child.state == S.IDLE


def test_park_leaves_a_failing_or_starting_child_alone() -> None:
    child, spawner = make_child()
    child.start(0.0)
    assert not child.park(1.0) and child.state == S.STARTING
    spawner.procs[-1].exit(1)
    child.step(1.0)
    assert child.state == S.BACKOFF
    assert not child.park(1.5) and child.state == S.BACKOFF


def test_stop_of_an_idle_child_makes_it_stopped() -> None:
    child, _ = running()
    child.park(10.0)
    child.step(10.5)
    child.stop(11.0)
    assert child.state == S.STOPPED


def test_a_stop_while_parking_ends_stopped() -> None:
    child, spawner = running()
    spawner.procs[-1].obeys = frozenset({9})
    child.park(10.0)
    child.stop(11.0)  # e.g. memd shuts down while the park is under way
    child.kill(11.0)
    child.step(11.1)
    assert child.state == S.STOPPED


def test_supervisor_start_while_parking_restarts_once_the_old_process_exited() -> None:
    clock = FakeClock()
    spawner = FakeSpawner()
    spawner.obeys = frozenset({9})  # slow to stop: the wake comes while STOPPING
    sup = Supervisor(spawner=spawner, clock=clock)
    sup.add(make_spec(startsecs=0.0))
    sup.step(0.0)
    sup.step(0.1)
    assert sup.child("w").state == S.RUNNING
    assert sup.park("w")
    sup.start("w")  # a change arrived while it stops
    sup.step(1.0)
    assert sup.child("w").state == S.STOPPING and len(spawner.procs) == 1
    sup.step(10.0)  # SIGKILL
    sup.step(10.1)  # reaped: IDLE, and wanted again, so started at once
    assert sup.child("w").state == S.STARTING and len(spawner.procs) == 2


def test_supervisor_park_then_start_and_shutdown_from_idle() -> None:
    async def go() -> None:
        clock = FakeClock(auto=0.01)
        spawner = FakeSpawner()
        sup = Supervisor(spawner=spawner, clock=clock, poll=0.0)
        sup.add(make_spec(startsecs=0.0))
        sup.step()
        sup.step()
        assert not sup.park("missing") if "missing" in sup else True
        assert sup.park("w")
        sup.step()
        assert sup.child("w").state == S.IDLE
        sup.step()
        assert sup.child("w").state == S.IDLE  # not wanted: stays down
        assert sup.status()["w"].state == "IDLE"
        sup.start("w")
        sup.step()
        assert sup.child("w").state in (S.STARTING, S.RUNNING)
        assert sup.park("w") is False or sup.child("w").state == S.STOPPING
        assert await sup.shutdown(timeout=5.0)
        assert sup.child("w").state == S.STOPPED

    asyncio.run(go())


# --- memd's use: WatchOnDemand parks after the idle time and wakes on a change ---------------


def _on_demand(tmp_path, idle: float = 60.0):  # type: ignore[no-untyped-def]
    from memd.indexing.daemon.watch_on_demand import WatchOnDemand

    clock = FakeClock()
    spawner = FakeSpawner()
    sup = Supervisor(spawner=spawner, clock=clock)
    sup.add(make_spec(name="ann/watch", startsecs=0.0))
    sup.step(0.0)
    sup.step(0.0)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    on_demand = WatchOnDemand(sup, idle, clock=clock)
    on_demand.add("ann", "ann/watch", sessions)
    return on_demand, sup, clock, spawner


def test_on_demand_parks_only_after_the_idle_time_and_wakes_on_a_change(tmp_path) -> None:  # type: ignore[no-untyped-def]
    on_demand, sup, clock, spawner = _on_demand(tmp_path, idle=20.0)
    assert 18.0 <= on_demand.check(1.0) <= 20.0  # next look when it becomes due
    assert sup.child("ann/watch").state == S.RUNNING
    on_demand.check(21.0)
    sup.step(21.5)
    assert sup.child("ann/watch").state == S.IDLE and len(spawner.procs) == 1
    clock.now = 100.0
    on_demand.touch("ann")
    sup.step(100.0)
    assert sup.child("ann/watch").state == S.RUNNING and len(spawner.procs) == 2
    assert on_demand.wakes == 1
    on_demand.check(110.0)  # 10 s after the change: not idle yet
    assert sup.child("ann/watch").state == S.RUNNING


def test_on_demand_zero_never_parks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    on_demand, sup, _, _ = _on_demand(tmp_path, idle=0.0)
    on_demand.check(10_000.0)
    assert sup.child("ann/watch").state == S.RUNNING


def test_on_demand_a_change_to_a_running_watcher_restarts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    on_demand, sup, _, spawner = _on_demand(tmp_path)
    on_demand.touch("ann")
    sup.step(5.0)
    assert sup.child("ann/watch").state == S.RUNNING and len(spawner.procs) == 1
    assert on_demand.wakes == 0


def test_a_gate_holds_back_a_start_from_idle() -> None:
    """A watcher woken while the shared index server does not serve its socket waits."""
    open_gate = False
    spawner = FakeSpawner()
    sup = Supervisor(spawner=spawner, clock=FakeClock())
    sup.add(make_spec(startsecs=0.0), gate=lambda: open_gate)
    open_gate = True
    sup.step(0.0)
    sup.step(0.1)
    sup.park("w")
    sup.step(0.2)
    assert sup.child("w").state == S.IDLE
    open_gate = False
    sup.start("w")
    sup.step(1.0)
    assert sup.child("w").state == S.IDLE and len(spawner.procs) == 1
    open_gate = True
    sup.step(2.0)
    assert sup.child("w").state == S.RUNNING and len(spawner.procs) == 2
