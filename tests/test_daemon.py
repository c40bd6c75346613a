"""The daemon end to end: real `memd run`, real socket, real signals, real config edits."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from memd.cli.client import RemoteError
from tests.support.daemon import REPO, DaemonProcess, base_config, write_config

CLIENTS = {
    "gw": {"memory_enabled": True, "mode": "both"},
    "agent": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "quiet": {"mode": "both"},
    "router": {"memory_enabled": True, "mode": "llm_only"},
}


def memd_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_status_and_clients(config_file, daemon_factory) -> None:
    path = config_file(clients=CLIENTS)
    memd = daemon_factory(path)
    status = memd.call("daemon.status")
    assert status["config_path"] == str(path)
    assert status["config_error"] is None
    assert status["uptime_seconds"] >= 0
    rss = psutil.Process(memd.proc.pid).memory_info().rss  # memd's own, not its children's
    assert abs(status["rss_bytes"] - rss) < 16 * 2**20
    assert set(status["clients"]) == set(CLIENTS)
    assert status["clients"]["gw"]["memory_on"] is True
    assert status["clients"]["router"]["memory_on"] is False
    rows = {c["client_id"]: c for c in memd.call("clients.list")["clients"]}
    assert rows["quiet"]["memory_enabled"] is None and rows["quiet"]["memory_on"] is False
    assert rows["router"]["supported_mode"] is False
    assert rows["agent"]["mode"] == "mcp_via_llm"

    out = memd_cli("status", "--config", str(path))
    assert out.returncode == 0, out.stderr
    assert "gw" in out.stdout and "unsupported mode" in out.stdout and " MB" in out.stdout
    out = memd_cli("clients", "--config", str(path))
    assert out.returncode == 0 and "off (unset)" in out.stdout


def test_unbuilt_or_unknown_method_is_method_not_found(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file())
    with pytest.raises(RemoteError) as err:
        memd.call("memory.forget_everything", {"client_id": "gw"})
    assert err.value.code == -32601


def test_bad_params_are_invalid_params(config_file, daemon_factory) -> None:
    memd = daemon_factory(config_file())
    with pytest.raises(RemoteError) as err:
        memd.call("daemon.status", {"verbose": True})
    assert err.value.code == -32602 and "verbose" in err.value.message


def test_layout_created_for_enabled_clients_only(config_file, daemon_factory, tmp_path) -> None:
    memd = daemon_factory(config_file(clients=CLIENTS))
    memory = tmp_path / "memory"
    assert (memory / "gw" / "sessions").is_dir()
    assert (memory / "agent" / "archive").is_dir()
    assert not (memory / "quiet").exists()
    assert not (memory / "router").exists()
    assert memd.call("daemon.status")["memory_dir"] == str(memory)


def test_socket_is_private(config_file, daemon_factory, tmp_path) -> None:
    memd = daemon_factory(config_file())
    sock = memd.socket
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700


def test_broken_edit_keeps_last_good_config(config_file, daemon_factory, tmp_path) -> None:
    path = config_file(clients={"gw": CLIENTS["gw"]})
    memd = daemon_factory(path)
    path.write_text(path.read_text() + "\nsearch_top_k = 'many'\n", encoding="utf-8")
    wait_for(lambda: memd.call("daemon.status")["config_error"] is not None)
    status = memd.call("daemon.status")
    assert "search_top_k" in status["config_error"]
    assert list(status["clients"]) == ["gw"]
    out = memd_cli("status", "--config", str(path))
    assert out.returncode == 0 and "last edit rejected" in out.stdout

    write_config(path, base_config(tmp_path, clients=CLIENTS))
    wait_for(lambda: set(memd.call("daemon.status")["clients"]) == set(CLIENTS))
    assert memd.call("daemon.status")["config_error"] is None
    assert (tmp_path / "memory" / "agent" / "sessions").is_dir()


def test_config_written_in_pieces_is_read_once_it_settles(
    config_file, daemon_factory, tmp_path
) -> None:
    """A save in two writes: the first piece ends at a line boundary before the clients, so
    on its own it is valid TOML that would switch every client off. memd waits for the
    file to stop changing and so only ever sees the whole file (equal to the running one)."""
    path = config_file(clients={"gw": CLIENTS["gw"], "agent": CLIENTS["agent"]})
    memd = daemon_factory(path)
    text = path.read_text(encoding="utf-8")
    cut = text.index("[clients.")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:cut])
        f.flush()
        time.sleep(0.15)  # a pause between the writer's two writes
        f.write(text[cut:])
    time.sleep(1.5)  # long enough for a reload of the first piece alone to finish
    write_config(
        path,
        base_config(
            tmp_path, clients={"gw": CLIENTS["gw"], "agent": CLIENTS["agent"]}, search_top_k=7
        ),
    )  # a later edit: once it is applied,
    wait_for(lambda: "config.applied" in memd.log())  # the pieced one was handled
    applied = [line for line in memd.log().splitlines() if "config.applied" in line]
    assert all("agent" in line and "gw" in line for line in applied), applied


def test_restart_only_keys_are_refused_live(config_file, daemon_factory, tmp_path) -> None:
    path = config_file()
    memd = daemon_factory(path)
    write_config(path, base_config(tmp_path, memory_dir=str(tmp_path / "elsewhere")))
    wait_for(lambda: memd.call("daemon.status")["config_error"] is not None)
    assert "needs a restart" in memd.call("daemon.status")["config_error"]
    assert memd.call("daemon.status")["memory_dir"] == str(tmp_path / "memory")


def test_second_daemon_refuses_and_first_keeps_serving(config_file, daemon_factory) -> None:
    path = config_file()
    first = daemon_factory(path)
    out = memd_cli("run", "--config", str(path), env={"HOME": str(path.parent / "home")})
    assert out.returncode == 3
    assert "already" in out.stderr
    assert first.call("daemon.status")["pid"] == first.proc.pid


def test_stale_socket_after_kill9_is_replaced(config_file, daemon_factory) -> None:
    path = config_file()
    first = daemon_factory(path)
    first.kill(signal.SIGKILL)
    first.proc.wait(10)
    assert first.socket.exists()  # left behind by the crash
    second = daemon_factory(path)
    assert second.call("daemon.status")["pid"] == second.proc.pid


def test_sigterm_exits_cleanly_and_removes_socket(config_file, daemon_factory) -> None:
    memd: DaemonProcess = daemon_factory(config_file())
    sock = memd.socket
    assert memd.stop(signal.SIGTERM) == 0
    assert not sock.exists()


def test_invalid_config_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[clients.gw]\nmemory_enabled = 'yes'\n", encoding="utf-8")
    out = memd_cli("run", "--config", str(path))
    assert out.returncode == 2
    assert f"{path}: clients.gw.memory_enabled" in out.stderr


def test_status_without_daemon_says_not_running(config_file) -> None:
    out = memd_cli("status", "--config", str(config_file()))
    assert out.returncode == 3 and "not running" in out.stderr


def test_path_prints_memory_folder(config_file, tmp_path) -> None:
    path = config_file(clients={"gw": CLIENTS["gw"]})
    assert memd_cli("path", "--config", str(path)).stdout.strip() == str(tmp_path / "memory")
    out = memd_cli("path", "gw", "--config", str(path))
    assert out.stdout.strip() == str(tmp_path / "memory" / "gw")
    assert memd_cli("path", "../x", "--config", str(path)).returncode == 2


def test_tells_systemd_ready_status_and_watchdog(config_file, daemon_factory, tmp_path) -> None:
    import socket as socketlib

    addr = tmp_path / "notify.sock"
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    listener.bind(str(addr))
    listener.settimeout(20)
    try:
        memd = daemon_factory(
            config_file(clients=CLIENTS),
            env={"NOTIFY_SOCKET": str(addr), "WATCHDOG_USEC": "400000"},
        )
        messages: list[str] = []
        while not any("WATCHDOG=1" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        ready = next(m for m in messages if "READY=1" in m)
        assert "STATUS=serving 2 clients" in ready
        memd.stop()
        while "STOPPING=1" not in messages[-1]:
            messages.append(listener.recv(4096).decode())
    finally:
        listener.close()
