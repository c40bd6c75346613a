"""Typed transitions and the settled tick: what lets memd's event loop sleep while nothing
changes (issue 29, wake-ups) without missing an exit, a gate opening or a state change
someone acts on (a catch-up once a watcher is RUNNING again)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable

from memd.supervision.child import ChildSpec
from memd.supervision.procs import PopenSpawner
from memd.supervision.spec import Transition
from memd.supervision.states import ProcessStates
from memd.supervision.supervisor import Supervisor
from tests.test_supervisor import make_spec, make_supervisor

S = ProcessStates


def test_listeners_hear_every_transition_with_its_process() -> None:
    sup, spawner, _ = make_supervisor(auto=0.0)
    heard: list[Transition] = []
    sup.listen(heard.append)
    sup.add(make_spec(name="w", restart_at_once=True))
    sup.step(0.0)
    sup.step(3.0)
    first = spawner.of("w")[0]
    first.exit(-9)
    sup.step(4.0)  # seen, restarted at once
    second = spawner.of("w")[1]
    assert [(t.name, t.old, t.new) for t in heard] == [
        ("w", S.STOPPED, S.STARTING),
        ("w", S.STARTING, S.RUNNING),
        ("w", S.RUNNING, S.EXITED),
        ("w", S.EXITED, S.STARTING),
    ]
    # RUNNING names the process that runs; leaving RUNNING names the one that left
    assert heard[1].pid == heard[2].pid == first.pid
    sup.step(7.0)
    assert heard[-1] == Transition("w", S.STARTING, S.RUNNING, second.pid)


def test_a_failing_listener_does_not_stop_supervision() -> None:
    sup, _, _ = make_supervisor(auto=0.0)
    heard: list[str] = []

    def broken(change: Transition) -> None:
        raise RuntimeError("a bug in a listener")

    sup.listen(broken)
    sup.listen(lambda change: heard.append(change.new))
    sup.add(make_spec(name="w"))
    sup.step(0.0)
    sup.step(3.0)
    assert sup.is_ready("w") and heard == [S.STARTING, S.RUNNING]


def _until(predicate: Callable[[], bool], bound: float = 30.0) -> Callable[[], object]:
    async def wait() -> None:
        deadline = time.monotonic() + bound
        while not predicate():
            assert time.monotonic() < deadline, "not within the bound"
            await asyncio.sleep(0.01)

    return wait


def test_a_settled_supervisor_still_sees_exits_and_opens_gates_at_once() -> None:
    """Real processes, real pidfds, a settled tick of an hour: a kill -9 is restarted, and
    a gated child (not settled: it waits to start) starts once its gate opens."""
    sup = Supervisor(
        spawner=PopenSpawner(), tick=0.05, poll=0.05, idle_tick=0.05, settled_tick=3600.0
    )
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    sup.add(ChildSpec(name="w", argv=sleeper, startsecs=0.0, restart_at_once=True))
    gate = {"open": False}
    running: list[str] = []
    sup.listen(lambda t: running.append(t.name) if t.new == S.RUNNING else None)

    async def scenario() -> None:
        runner = asyncio.create_task(sup.run())
        await _until(lambda: sup.is_ready("w"))()
        first = sup.child("w").proc
        assert first is not None
        subprocess.run(["kill", "-9", str(first.pid)], check=True)
        await _until(lambda: sup.is_ready("w") and sup.child("w").proc is not first)()
        sup.add(ChildSpec(name="v", argv=sleeper, startsecs=0.0), gate=lambda: gate["open"])
        await asyncio.sleep(0.2)
        assert sup.child("v").state == S.STOPPED  # held by its gate
        gate["open"] = True
        await _until(lambda: sup.is_ready("v"))()
        assert await sup.shutdown(timeout=10.0)
        await asyncio.wait_for(runner, timeout=5.0)

    asyncio.run(scenario())
    assert running == ["w", "w", "v"]


def test_settled_means_nothing_left_to_move_on() -> None:
    sup, spawner, _ = make_supervisor(auto=0.0)
    sup.add(make_spec(name="w"))
    child = sup.child("w")
    assert not child.settled(wanted=True)  # wanted, not started yet
    sup.step(0.0)
    assert not child.settled(wanted=True)  # STARTING
    sup.step(3.0)
    assert child.settled(wanted=True)  # RUNNING
    spawner.of("w")[0].exit(1)
    sup.step(4.0)
    assert child.state == S.EXITED and child.settled(wanted=True)  # its backoff has a time
    sup.step(5.0)
    assert sup.park("w") is False  # STARTING again: not parked, not settled
    assert not child.settled(wanted=True)
    sup.step(8.0)
    assert sup.park("w") and not child.settled(wanted=False)  # STOPPING
    sup.step(8.5)
    assert child.state == S.IDLE and child.settled(wanted=False)
    assert not child.settled(wanted=True)  # woken: it is to start
