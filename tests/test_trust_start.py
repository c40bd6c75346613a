"""Where memd starts from, and the folders above memory_dir, against another local user.

- memd started from a folder another user can write (`cd /tmp && memd run`) must not run
  code planted there: its children start in a folder memd trusts, with an import path
  that holds only the installation (issue 24, item 5).
- memory_dir's ancestors follow the socket path's rule (no folder on the way writable by
  others unless sticky): at start and whenever a client folder is opened (item 6).

Attacker steps run as uid 65534 (tests/support/hostile.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess, write_config
from tests.support.faults import call, pipeline_running, wait_for
from tests.support.hostile import (
    area_config,
    needs_hostile,
    nobody_python,
    open_area,
    start_refused,
)

pytestmark = pytest.mark.faults

MCP = {"memory_enabled": True, "mode": "mcp_via_llm"}
PLANTED = ("truststore", "memsearch", "pymilvus", "openai", "memd")


@pytest.fixture
def area():
    with open_area() as folder:
        yield folder


def _plant(start: Path, marks: Path) -> None:
    """As nobody: a module for each name in PLANTED (memd as a package) that leaves a mark."""
    code = (
        "import os, sys\n"
        "start, marks = sys.argv[1], sys.argv[2]\n"
        "for name in sys.argv[3:]:\n"
        '    body = f\'open({marks!r} + "/{name}", "w").write(str(os.getuid()))\\n\'\n'
        "    if name == 'memd':\n"
        "        os.mkdir(start + '/memd')\n"
        "        path = start + '/memd/__init__.py'\n"
        "    else:\n"
        "        path = start + '/' + name + '.py'\n"
        "    with open(path, 'w') as f:\n"
        "        f.write('import os\\n' + body)\n"
    )
    nobody_python(code, str(start), str(marks), *PLANTED)


def _memd_from(start: Path, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """`cd START && memd run`, the installed entry point as a user runs it."""
    memd = Path(sys.executable).parent / "memd"
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(memd), "run", "--config", str(config)],
            cwd=start,
            stdout=out,
            stderr=out,
            env={**os.environ, "HOME": str(config.parent / "home")},
            start_new_session=True,
        )


@needs_hostile
def test_modules_planted_in_the_starting_folder_never_run(area: Path) -> None:
    """Started from a sticky world-writable folder where nobody planted `truststore.py`,
    `memsearch.py`, ... and a `memd/` package: the zygote runs (not FATAL), forks the
    client's children, and none of the planted code ever ran as memd's uid."""
    start = area / "start"
    start.mkdir()
    os.chmod(start, 0o1777)
    marks = area / "marks"
    marks.mkdir(mode=0o777)
    os.chmod(marks, 0o777)
    _plant(start, marks)
    assert (start / "memd" / "__init__.py").exists() and (start / "truststore.py").exists()
    config = area_config(area, {"alice": MCP})
    log = area / "memd.log"
    proc = _memd_from(start, config, log)
    sock = area / "run" / "memd.sock"
    try:
        wait_for(lambda: sock.exists() and pipeline_running(sock, "alice"), 120, what="pipeline")
        zygote = call(sock, "daemon.status")["zygote"]
        assert zygote["process"]["state"] == "RUNNING", zygote
        assert zygote["forked"] >= 1, zygote
        call(
            sock,
            "memory.record_exchange",
            {"client_id": "alice", "conversation_id": "c", "user": "hi", "assistant": "ok"},
        )
        assert sorted(p.name for p in marks.iterdir()) == [], log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(30)


@needs_hostile
@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_memory_dir_below_a_writable_ancestor_refuses_daemon(area: Path, mode: int) -> None:
    """memory_dir = <area>/ww/memory with `ww` writable by others: whoever can write `ww`
    can rename memory_dir away and put their own folder there. memd refuses, naming `ww`."""
    ww = area / "ww"
    ww.mkdir()
    os.chmod(ww, mode)
    config = area_config(area, {"alice": MCP}, memory_dir=str(ww / "memory"))
    code, log = start_refused(config)
    assert code != 0
    assert str(ww) in log and "chmod" in log and "memory_dir" in log, log[-2000:]
    assert not list((ww / "memory").rglob("*.md")) if (ww / "memory").exists() else True


def test_memory_dir_below_a_sticky_folder_is_accepted(area: Path) -> None:
    """A sticky-bit folder of root's (like /tmp) lets nobody rename another's entries."""
    sticky = area / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    config = area_config(area, {"alice": MCP}, memory_dir=str(sticky / "memory"))
    memd = DaemonProcess(config).start()
    try:
        result = call(
            memd.socket,
            "memory.record_exchange",
            {"client_id": "alice", "conversation_id": "c", "user": "hi", "assistant": "ok"},
        )
        assert result["conversation"] == 1
    finally:
        memd.stop()


@needs_hostile
def test_client_opened_after_an_ancestor_became_writable_is_refused(area: Path) -> None:
    """memd started fine; then memory_dir's parent became world-writable and nobody can
    swap memory_dir. A client opened from then on (added by a reload) is refused with the
    folder and the fix named, and nothing is written for it."""
    parent = area / "parent"
    parent.mkdir()
    os.chmod(parent, 0o755)
    memory = parent / "memory"
    config = area_config(area, {"alice": MCP}, memory_dir=str(memory))
    memd = DaemonProcess(config).start()
    try:
        os.chmod(parent, 0o777)
        data = {"memory_dir": str(memory), "socket": str(area / "run" / "memd.sock")}
        write_config(config, {**data, "clients": {"alice": MCP, "bob": MCP}})

        def refused() -> str:
            try:
                call(
                    memd.socket,
                    "memory.record_exchange",
                    {
                        "client_id": "bob",
                        "conversation_id": "c",
                        "user": "pin 9931",
                        "assistant": "k",
                    },
                )
            except RemoteError as exc:
                return exc.message if str(parent) in exc.message else ""
            return ""

        message = wait_for(refused, 60, what="bob refused")
        assert "chmod" in message, message
        assert not (memory / "bob").exists() or not list((memory / "bob").rglob("*.md"))
    finally:
        memd.stop()
