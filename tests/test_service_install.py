"""`memd service install | uninstall | status`: what it writes, that systemd accepts it
and rates it safe, and (with a private `systemd --user`) that the sandboxed service runs
the real daemon, records and recalls, and is undone cleanly."""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from memd.cli.service_files import (
    SANDBOX,
    ServicePlan,
    render_unit,
    shipped_plist,
    shipped_unit,
)
from tests.support import usermanager
from tests.support.cli import MEMD, User

REPO = Path(__file__).resolve().parents[1]
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze missing")


@pytest.fixture
def user(tmp_path: Path) -> User:
    return User(tmp_path, runtime_dir=tmp_path / "run")


def unit_values(text: str, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", text, re.M)


def exposure(unit: Path, tmp_path: Path) -> float:
    runtime = tmp_path / "analyze-run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run(
        [str(ANALYZE), "security", "--offline=true", "--user", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


def test_print_writes_the_unit_for_this_memd_and_config_and_installs_nothing(
    user: User, tmp_path: Path
) -> None:
    config = tmp_path / "my config" / "memd.toml"  # a space: quoted as systemd reads it
    assert user.memd("init", "--client", "demo", "--config", str(config)).code == 0
    done = user.memd("service", "install", "--print", "--config", str(config))
    assert done.code == 0, done.err
    [exec_start] = unit_values(done.out, "ExecStart")
    assert shlex.split(exec_start) == [str(MEMD), "run", "--config", str(config)]
    memory = user.home / ".localrouter" / "memory"
    assert unit_values(done.out, "ReadWritePaths") == [str(memory)]
    assert unit_values(done.out, "RuntimeDirectory") == ["memd"]
    for key, value in SANDBOX:
        assert value in unit_values(done.out, key), key
    assert "PrivateTmp=yes" not in done.out  # the config is under /tmp here
    assert not (user.home / ".config" / "systemd").exists() and not memory.exists()


def test_install_without_a_config_says_to_run_init(user: User) -> None:
    done = user.memd("service", "install", "--print")
    assert done.code == 2
    assert "memd init" in done.err and str(user.default_config) in done.err


@needs_analyze
def test_systemd_accepts_the_unit_and_rates_it_safe(user: User, tmp_path: Path) -> None:
    assert user.memd("init", "--client", "demo").code == 0
    printed = user.memd("service", "install", "--print").out
    unit = tmp_path / "memd.service"
    unit.write_text(printed)
    done = subprocess.run(
        [str(ANALYZE), "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    problems = [line for line in (done.stdout + done.stderr).splitlines() if "memd" in line]
    assert done.returncode == 0 and not problems, done.stdout + done.stderr
    assert exposure(unit, tmp_path) <= 4.0

    # Paths outside /tmp, as in a real home: PrivateTmp too, and still safe.
    home = ServicePlan(
        command=("/home/you/.local/bin/memd",),  # a pipx install (this checkout may be in /tmp)
        config_path=Path("/home/you/.config/memd/config.toml"),
        memory_dir=Path("/home/you/.localrouter/memory"),
        socket_dir=Path("/home/you/run"),
    )
    text = render_unit(home)
    assert "PrivateTmp=yes" in text
    assert unit_values(text, "ReadWritePaths") == ["/home/you/.localrouter/memory", "/home/you/run"]
    unit.write_text(text)
    assert exposure(unit, tmp_path) <= 4.0


def test_the_launch_agent_runs_this_memd_with_this_config(user: User) -> None:
    assert user.memd("init", "--client", "demo").code == 0
    done = user.memd("service", "install", "--print", "--manager", "launchd")
    assert done.code == 0, done.err
    agent = plistlib.loads(done.out.encode())
    assert agent["ProgramArguments"] == [str(MEMD), "run", "--config", str(user.default_config)]
    assert agent["KeepAlive"] == {"SuccessfulExit": False} and agent["RunAtLoad"] is True
    assert agent["StandardErrorPath"] == str(user.home / "Library/Logs/memd/memd.log")


def test_shipped_service_files_are_what_install_writes_for_a_pipx_install() -> None:
    assert (REPO / "systemd" / "memd.service").read_text() == shipped_unit()
    assert (REPO / "launchd" / "dev.memd.plist").read_bytes() == shipped_plist()


# --- the real thing: a private systemd --user ---------------------------------------------


@pytest.fixture
def manager(tmp_path: Path):
    why = usermanager.available()
    if why:
        pytest.skip(f"no private systemd --user here: {why}")
    um = usermanager.UserManager(tmp_path / "systemd.log")
    try:
        um.start()
    except (RuntimeError, TimeoutError) as exc:
        um.stop()
        pytest.skip(f"systemd --user would not start here: {exc}")
    yield um
    um.stop()


def wait_until(check, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_install_runs_the_sandboxed_daemon_and_uninstall_undoes_it(manager) -> None:
    memd = str(MEMD)
    units = manager.home / ".config" / "systemd" / "user"
    # Settings this machine cannot apply at all (not memd's doing) are turned off in a
    # drop-in of the test's own; everything else in the unit applies as written.
    unsupported = manager.unsupported([(k, v) for k, v in SANDBOX if v in ("yes", "strict")])
    assert not set(unsupported) & {"NoNewPrivileges", "ProtectSystem", "MemoryDenyWriteExecute"}
    if unsupported:
        print(f"turned off, unsupported on this machine: {', '.join(unsupported)}")
        dropin = units / "memd.service.d"
        dropin.mkdir(parents=True)
        (dropin / "here.conf").write_text(
            "[Service]\n" + "".join(f"{key}=no\n" for key in unsupported)
        )

    assert manager.run(memd, "init", "--client", "demo").returncode == 0
    done = manager.run(memd, "service", "install")
    assert done.returncode == 0, done.stdout + done.stderr + manager.log()
    unit = units / "memd.service"
    assert f"installed {unit}" in done.stdout
    installed = unit.read_text()
    # Home and runtime dir are not in /tmp; the memd it runs is this checkout's, which may be.
    checkout_in_tmp = any(
        MEMD.resolve().is_relative_to(t) for t in (Path("/tmp"), Path("/var/tmp"))
    )
    assert ("PrivateTmp=yes" in installed) is not checkout_in_tmp
    verify = manager.run("systemd-analyze", "verify", "--user", str(unit))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert manager.run("systemctl", "--user", "is-enabled", "memd").stdout.strip() == "enabled"

    status = wait_until(
        lambda: (r := manager.run(memd, "status")).returncode == 0 and r, "memd status"
    )
    assert re.search(r"^demo\s+both\s+on\s", status.stdout, re.M), status.stdout
    main_pid = manager.run("systemctl", "--user", "show", "-p", "MainPID", "--value", "memd")
    proc_status = Path(f"/proc/{main_pid.stdout.strip()}/status").read_text()
    assert re.search(r"^NoNewPrivs:\s+1$", proc_status, re.M)
    assert re.search(r"^Seccomp:\s+2$", proc_status, re.M)

    recorded = manager.run(
        memd,
        "record",
        "demo",
        "--conversation",
        "c1",
        "--user",
        "Where is the spare key?",
        "--assistant",
        "Under the blue pot.",
    )
    assert recorded.returncode == 0, recorded.stderr
    found = wait_until(
        lambda: "blue pot" in (r := manager.run(memd, "recall", "demo", "spare key")).stdout and r,
        "recall to find the exchange (the watcher indexes it)",
    )
    assert found.returncode == 0
    # The children bind their sockets inside the sandbox too (the unit's runtime folder):
    # the zygote, the shared index server and the embedder run, nothing needs attention.
    status = manager.run(memd, "status").stdout
    assert "needs attention" not in status and "embedder RUNNING" in status, status
    shown = manager.run(memd, "service", "status")
    assert shown.returncode == 0 and "active   active" in shown.stdout, shown.stdout

    done = manager.run(memd, "service", "uninstall")
    assert done.returncode == 0, done.stderr
    assert not unit.exists()
    assert manager.run("systemctl", "--user", "is-active", "memd").stdout.strip() in (
        "inactive",
        "unknown",
    )
    assert manager.run(memd, "status").returncode == 3
    assert manager.run(memd, "service", "status").returncode == 3
    memory = manager.home / ".localrouter" / "memory" / "demo" / "sessions"
    assert any(memory.iterdir())  # uninstall keeps the memories


def test_install_without_a_user_manager_says_what_to_do_and_leaves_nothing(
    user: User, tmp_path: Path
) -> None:
    """No `systemd --user` to talk to (a container, a shell without a login session):
    the install fails naming `loginctl enable-linger` and `memd run`, points at no
    journal, and leaves no unit, no ~/.config/systemd, no folder behind (issue 24)."""
    bus = tmp_path / "no-bus"  # a user bus that is not there, whatever this machine has
    assert user.memd("init", "--client", "demo").code == 0
    before = sorted(p.relative_to(user.home) for p in user.home.rglob("*"))
    done = user.memd(
        "service", "install", DBUS_SESSION_BUS_ADDRESS=f"unix:path={bus}",
        XDG_RUNTIME_DIR=str(tmp_path / "no-runtime"),
    )  # fmt: skip
    assert done.code != 0
    assert "loginctl enable-linger" in done.err and "memd run" in done.err, done.err
    assert "journalctl" not in done.err + done.out
    assert not (user.home / ".config" / "systemd").exists()
    assert sorted(p.relative_to(user.home) for p in user.home.rglob("*")) == before
