"""Children forked from the zygote: real separate processes under the unchanged contract.

The zygote here preloads only a tiny target program (tests/support/zygote_target.py),
except in the test that forks the real index server; the daemon-level tests (real
`memsearch watch`, kill -9 under record load) are in test_zygote_daemon.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from memd.supervision.child import ChildSpec
from memd.supervision.procs import reap_leftovers
from memd.supervision.states import ProcessStates
from memd.supervision.supervisor import Supervisor
from memd.supervision.zygote_spawner import ZYGOTE_NAME, ZygoteSpawner, zygote_spec
from tests.support.processes import gone, wait_until

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the zygote needs PR_SET_CHILD_SUBREAPER"
)

PY = sys.executable
S = ProcessStates
TARGET = "tests.support.zygote_target"
REPO = Path(__file__).resolve().parents[1]


class Rig:
    """A supervisor whose spawner forks TARGET from a zygote that preloads only it."""

    def __init__(
        self,
        tmp: Path,
        *,
        enabled: bool = True,
        modules: tuple[str, ...] = (TARGET,),
        preload: tuple[str, ...] = ("json",),
        zygote_args: tuple[str, ...] = (),
        zygote_env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.spawner = ZygoteSpawner(tmp / "zygote.sock", enabled=enabled, modules=modules)
        self.sup = Supervisor(spawner=self.spawner, tick=0.02, poll=0.02)
        self.spawner.zygote_ready = lambda: self.sup.is_ready(ZYGOTE_NAME)
        if enabled:
            spec = zygote_spec(
                tmp / "zygote.sock",
                tmp / "zygote.log",
                tmp / "zygote.pid",
                modules=modules,
                preload=preload,
                home=tmp,
            )
            # The zygote starts in `/` with PYTHONSAFEPATH: the test target is found
            # through PYTHONPATH, never through the working directory.
            env = {**(spec.env or {}), **(zygote_env or {}), "PYTHONPATH": str(REPO)}
            argv = (*spec.argv, *zygote_args)
            self.sup.add(dataclasses.replace(spec, env=env, argv=argv))
            assert asyncio.run(self.sup.wait_ready(ZYGOTE_NAME, 120)), self.log("zygote")

    def add(self, name: str, mode: str = "run", **kw: object) -> Path:
        out = self.tmp / f"{name}.json"
        out.unlink(missing_ok=True)
        spec = {
            "argv": (PY, "-m", TARGET, str(out), mode),
            "cwd": self.tmp,
            "env": {**os.environ, "ZYGOTE_TARGET": name, "PYTHONPATH": str(REPO)},
            "log_path": self.tmp / f"{name}.log",
            "pidfile": self.tmp / "pids" / f"{name}.pid",
            "startsecs": 0.1,
            "ready": out.exists,
            "backoff_start": 0.05,
        }
        spec.update(kw)
        self.sup.add(ChildSpec(name=name, **spec))  # type: ignore[arg-type]
        return out

    def ready(self, name: str) -> dict[str, object]:
        assert asyncio.run(self.sup.wait_ready(name, 60)), self.log(name)
        return json.loads((self.tmp / f"{name}.json").read_text())

    def pid(self, name: str) -> int:
        pid = self.sup.status()[name].pid
        assert pid is not None
        return pid

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        pids = [c.pid for c in self.sup.status().values() if c.pid]
        assert asyncio.run(self.sup.shutdown(timeout=10.0))
        self.spawner.close()
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def test_forked_child_is_its_own_process_with_the_command_it_asked_for(rig: Rig) -> None:
    rig.add("one")
    seen = rig.ready("one")
    pid = rig.pid("one")
    assert rig.spawner.forked == 1
    zygote = rig.pid(ZYGOTE_NAME)
    # memd's own child (re-parented from the zygote), in its own session and group.
    assert seen["pid"] == pid != zygote
    assert seen["ppid"] == os.getpid() == psutil.Process(pid).ppid()
    assert seen["pgid"] == seen["sid"] == pid
    assert seen["argv"][1:] == [str(rig.tmp / "one.json"), "run"]  # type: ignore[index]
    assert (seen["cwd"], seen["env"]) == (str(rig.tmp), "one")
    assert seen["sigint"] == str(signal.default_int_handler)
    assert seen["fds"] == [0, 1, 2, 3]  # 3: the listing itself; nothing of the zygote's
    line = " ".join(psutil.Process(pid).cmdline())
    assert f"-m {TARGET} {rig.tmp / 'one.json'} run" in line
    assert "zygote_target up" in rig.log("one") and rig.log("one").startswith("--- memd ")
    # Stopped like a plain child: SIGINT, its KeyboardInterrupt cleanup, exit 0.
    assert asyncio.run(rig.sup.stop("one"))
    status = rig.sup.status()["one"]
    assert (status.last_exit_code, status.last_signal) == (0, None)
    assert (rig.tmp / "one.clean").read_text() == "cleaned up"
    assert not (rig.tmp / "pids" / "one.pid").exists()


def test_exit_codes_and_signals_reach_the_state_machine(rig: Rig) -> None:
    rig.add("bad", mode="exit3", startsecs=5.0, startretries=1)
    wait_until(lambda: rig.sup.child("bad").state == S.FATAL, sup=rig.sup)
    assert rig.sup.status()["bad"].last_exit_code == 3
    assert rig.spawner.forked == 2
    rig.add("killed")
    rig.ready("killed")
    os.kill(rig.pid("killed"), signal.SIGKILL)
    wait_until(lambda: rig.sup.child("killed").state != S.RUNNING, sup=rig.sup)
    status = rig.sup.status()["killed"]
    assert status.last_signal == "SIGKILL" and status.state in (S.EXITED, S.STARTING)
    wait_until(lambda: rig.sup.is_ready("killed"), sup=rig.sup)


def test_killed_zygote_leaves_children_running_and_spawns_fall_back_until_it_is_back(
    rig: Rig,
) -> None:
    rig.add("keeps")
    rig.ready("keeps")
    child = rig.pid("keeps")
    zygote = rig.pid(ZYGOTE_NAME)
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: rig.sup.status()[ZYGOTE_NAME].pid != zygote, sup=rig.sup)
    assert not gone(child) and rig.sup.is_ready("keeps")
    rig.add("meanwhile")  # the zygote is STARTING again: plain spawn
    rig.ready("meanwhile")
    assert rig.spawner.plain >= 2  # the zygote itself twice, or it and "meanwhile"
    assert psutil.Process(rig.pid("meanwhile")).ppid() == os.getpid()
    assert asyncio.run(rig.sup.wait_ready(ZYGOTE_NAME, 120))
    forked = rig.spawner.forked
    rig.add("after")
    rig.ready("after")
    assert rig.spawner.forked == forked + 1
    assert asyncio.run(rig.sup.stop("keeps"))
    assert rig.sup.status()["keeps"].last_exit_code == 0


def test_zygote_killed_in_a_loop_keeps_exactly_one_process_per_child(rig: Rig) -> None:
    names = [f"c{i}" for i in range(3)]
    for name in names:
        rig.add(name)
    for round_ in range(4):
        for name in names:
            rig.ready(name)
            os.kill(rig.pid(name), signal.SIGKILL)  # each child restarts ...
        # ... while the zygote is down (killed again, whether it was back or still starting)
        wait_until(lambda: rig.sup.status()[ZYGOTE_NAME].pid is not None, sup=rig.sup)
        os.kill(rig.pid(ZYGOTE_NAME), signal.SIGKILL)
        wait_until(lambda: all(rig.sup.is_ready(n) for n in names), timeout=60, sup=rig.sup)
        if round_ % 2:
            assert asyncio.run(rig.sup.wait_ready(ZYGOTE_NAME, 120))
    live = [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
    per_child = {
        n: sum(1 for p in live if str(rig.tmp / f"{n}.json") in " ".join(p.cmdline()))
        for n in names
    }
    assert per_child == dict.fromkeys(names, 1), per_child
    assert rig.spawner.forked > 0 and rig.spawner.plain > 4


def test_disabled_zygote_spawns_plainly(tmp_path: Path) -> None:
    r = Rig(tmp_path, enabled=False)
    try:
        r.add("plain")
        seen = r.ready("plain")
        assert (r.spawner.forked, r.spawner.plain) == (0, 1)
        assert ZYGOTE_NAME not in r.sup.status()
        assert seen["ppid"] == os.getpid()
    finally:
        r.close()


def test_commands_the_zygote_did_not_preload_are_spawned_plainly(rig: Rig) -> None:
    out = rig.tmp / "other.json"
    rig.add(
        "other",
        argv=(
            PY,
            "-c",
            "import os, sys, pathlib, time; "
            "out = pathlib.Path(sys.argv[1]); tmp = out.with_suffix('.tmp'); "
            "tmp.write_text('{}'); os.replace(tmp, out); "  # ready means written
            "time.sleep(600)",
            str(out),
        ),
    )
    rig.ready("other")
    assert rig.spawner.forked == 0


def test_pidfile_of_a_forked_child_lets_the_next_start_reap_it(rig: Rig) -> None:
    rig.add("left")
    rig.ready("left")
    pid = rig.pid("left")
    record = json.loads((rig.tmp / "pids" / "left.pid").read_text())
    assert record["pid"] == pid and record["forked"] is True
    assert reap_leftovers(rig.tmp / "pids", timeout=5.0) == [pid]  # as memd does at start
    wait_until(lambda: rig.sup.child("left").state != S.RUNNING, sup=rig.sup)
    assert (rig.tmp / "left.clean").exists()  # it got its stop signal, SIGINT


def test_orphaned_zombies_of_a_childs_tree_are_reaped(rig: Rig) -> None:
    rig.add(
        "parent",
        argv=(
            PY,
            "-c",
            "import os, subprocess, sys, pathlib, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'pass']); "
            "out = pathlib.Path(sys.argv[1]); tmp = out.with_suffix('.tmp'); "
            "tmp.write_text(str(p.pid)); os.replace(tmp, out); "  # ready means written
            "time.sleep(600)",
            str(rig.tmp / "parent.json"),
        ),
    )
    rig.ready("parent")
    # The grandchild exited; when its parent is killed it comes to us as a zombie.
    grandchild = int((rig.tmp / "parent.json").read_text())
    os.kill(rig.pid("parent"), signal.SIGKILL)
    wait_until(lambda: rig.sup.child("parent").state != S.RUNNING, sup=rig.sup)
    wait_until(lambda: grandchild in rig.spawner.reap_strays() or gone_for_good(grandchild))
    assert gone_for_good(grandchild)


def gone_for_good(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).ppid() != os.getpid()


LAUNCHER = """
import asyncio, json, os, pathlib, sys
from memd.supervision.child import ChildSpec
from memd.supervision.supervisor import Supervisor
from memd.supervision.zygote_spawner import ZYGOTE_NAME, ZygoteSpawner, zygote_spec

tmp = pathlib.Path(sys.argv[1])
async def main():
    spawner = ZygoteSpawner(tmp / "z.sock", modules=("tests.support.zygote_target",))
    sup = Supervisor(spawner=spawner, tick=0.05)
    spawner.zygote_ready = lambda: sup.is_ready(ZYGOTE_NAME)
    sup.add(zygote_spec(tmp / "z.sock", tmp / "z.log", None, preload=("json",),
                        modules=("tests.support.zygote_target",)))
    assert await sup.wait_ready(ZYGOTE_NAME, 120)
    sup.add(ChildSpec(name="c", argv=(sys.executable, "-m", "tests.support.zygote_target",
                                      str(tmp / "c.json")), startsecs=0.1))
    assert await sup.wait_ready("c", 60)
    pids = {"zygote": sup.status()[ZYGOTE_NAME].pid, "child": sup.status()["c"].pid,
            "forked": spawner.forked}
    (tmp / "pids.tmp").write_text(json.dumps(pids))
    os.replace(tmp / "pids.tmp", tmp / "pids.json")
    await sup.run()

asyncio.run(main())
"""


def test_kill_9_of_memd_takes_the_zygote_and_its_children_along(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [PY, "-c", LAUNCHER, str(tmp_path)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    pids: dict[str, int] = {}
    try:
        out = tmp_path / "pids.json"
        wait_until(out.exists, timeout=180)
        pids = json.loads(out.read_text())
        assert pids["forked"] == 1 and not gone(pids["child"]) and not gone(pids["zygote"])
        launcher.kill()
        launcher.wait()
        wait_until(lambda: gone(pids["child"]) and gone(pids["zygote"]), timeout=10)
    finally:
        launcher.kill()
        launcher.wait()
        for pid in (pids.get("child"), pids.get("zygote")):
            if pid and not gone(pid):
                os.kill(pid, signal.SIGKILL)
