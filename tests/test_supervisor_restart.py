"""How soon a dead child is replaced: at once the first time, then with backoff (issue 29).

The rules under test (docs/supervision.md): with `restart_at_once`, the first exit after a
start, a reset or reset_after seconds RUNNING is restarted in the same tick, whether the
child was RUNNING or still STARTING; a fast failure still counts against startretries, so
a crash-looping child backs off and goes FATAL after as many tries as before.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from memd.supervision.procs import PopenSpawner
from memd.supervision.states import ProcessStates
from memd.supervision.supervisor import ChildSpec, Supervisor
from tests.test_supervisor import FakeClock, FakeSpawner, fail_fast, make_child, make_spec

S = ProcessStates


def test_first_fast_failure_after_a_start_is_retried_at_once_then_backs_off() -> None:
    child, spawner = make_child(restart_at_once=True, startretries=3)
    child.start(0.0)
    fail_fast(child, spawner, 1.0)  # killed in its start-up: no backoff wait
    assert child.state == S.STARTING and len(spawner.procs) == 2
    assert child.retries == 1, "a fast failure still counts"
    fail_fast(child, spawner, 2.0)
    assert child.state == S.BACKOFF and child.next_start_at == pytest.approx(3.0)
    child.step(3.0)
    fail_fast(child, spawner, 3.5)
    assert child.state == S.BACKOFF and child.next_start_at == pytest.approx(5.5)
    child.step(5.5)
    fail_fast(child, spawner, 6.0)
    assert child.state == S.FATAL, "FATAL after startretries + 1 fast failures, as before"
    assert len(spawner.procs) == 4 and child.next_start_at is None


def test_without_restart_at_once_the_first_fast_failure_waits_backoff_start() -> None:
    child, spawner = make_child(startretries=3)
    child.start(0.0)
    fail_fast(child, spawner, 1.0)
    assert child.state == S.BACKOFF and child.next_start_at == pytest.approx(2.0)


def test_a_crash_loop_gets_one_immediate_restart_per_start_or_reset() -> None:
    """After FATAL, a reset re-arms the immediate restart once; nothing else does."""
    child, spawner = make_child(restart_at_once=True, startretries=1)
    child.start(0.0)
    fail_fast(child, spawner, 0.5)
    assert child.state == S.STARTING
    fail_fast(child, spawner, 0.6)
    assert child.state == S.FATAL and len(spawner.procs) == 2
    assert child.reset()
    child.start(10.0)
    fail_fast(child, spawner, 10.5)
    assert child.state == S.STARTING and len(spawner.procs) == 4
    fail_fast(child, spawner, 10.6)
    assert child.state == S.FATAL


def test_an_immediate_restart_of_a_running_child_disarms_it_for_a_fast_failure() -> None:
    """A RUNNING child's exit uses the one immediate restart; if the replacement then fails
    in its start-up, that waits backoff_start."""
    child, spawner = make_child(restart_at_once=True, startsecs=0.0)
    child.start(0.0)
    child.step(0.0)
    assert child.state == S.RUNNING
    spawner.procs[-1].exit(-9)
    child.step(5.0)
    assert child.state == S.STARTING and len(spawner.procs) == 2
    fail_fast(child, spawner, 5.1)
    assert child.state == S.BACKOFF and child.next_start_at == pytest.approx(6.1)


def test_supervisor_restarts_a_child_killed_while_starting_in_the_same_step() -> None:
    sup = Supervisor(spawner=FakeSpawner(), clock=FakeClock(), tick=0.0, poll=0.0)
    spawner = sup._spawner
    assert isinstance(spawner, FakeSpawner)
    sup.add(make_spec(name="w", restart_at_once=True, ready=lambda: False, startsecs=0.0))
    sup.step(0.0)
    spawner.procs[-1].exit(-9)
    sup.step(0.1)
    assert sup.child("w").state == S.STARTING and len(spawner.procs) == 2


def test_real_child_killed_in_its_start_up_is_back_without_the_backoff() -> None:
    """Real processes and pidfds: a child that never gets ready (so stays STARTING) is
    kill -9'd; with an hour of backoff_start, only the immediate restart can bring it
    back. The second kill then waits that hour (BACKOFF)."""
    sup = Supervisor(spawner=PopenSpawner(), tick=0.05, poll=0.05, idle_tick=3600.0)
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    spec = ChildSpec(
        name="w",
        argv=sleeper,
        startsecs=0.0,
        ready=lambda: False,
        ready_timeout=3600.0,
        backoff_start=3600.0,
        backoff_cap=3600.0,
        restart_at_once=True,
    )
    sup.add(spec)

    async def until(predicate: object, bound: float = 30.0) -> None:
        deadline = time.monotonic() + bound
        while not predicate():  # type: ignore[operator]
            assert time.monotonic() < deadline, "not within the bound"
            await asyncio.sleep(0.01)

    def pid() -> int | None:
        proc = sup.child("w").proc
        return proc.pid if proc is not None else None

    async def scenario() -> None:
        runner = asyncio.create_task(sup.run())
        await until(lambda: pid() is not None)
        first = pid()
        assert first is not None and sup.child("w").state == S.STARTING
        os.kill(first, signal.SIGKILL)
        await until(lambda: pid() not in (None, first))
        assert sup.child("w").state == S.STARTING and sup.child("w").retries == 1
        second = pid()
        assert second is not None
        os.kill(second, signal.SIGKILL)
        await until(lambda: sup.child("w").state == S.BACKOFF)
        status = sup.child_status("w")
        assert status is not None and status.next_start_in is not None
        assert status.next_start_in > 60, "the second fast failure waits its backoff"
        assert await sup.shutdown(timeout=10.0)
        await asyncio.wait_for(runner, timeout=5.0)

    asyncio.run(scenario())
