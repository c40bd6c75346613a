"""What the human CLI says about a running daemon: duplicates, restarts, failed compactions,
recompaction progress, and an MCP entry from `--print-config` that really works."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.support.cli import User
from tests.support.daemon import DaemonProcess
from tests.support.fake_llm import FakeLLM

pytestmark = pytest.mark.slow

CLIENT = "desk"
WAIT = 60.0


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        server.retry_after_ms = 5
        yield server


def wait_for(predicate: Callable[[], Any], what: str, memd: DaemonProcess) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{memd.log()}")


def test_record_chat_says_when_nothing_new_was_written(
    tmp_path: Path, config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    config = config_file(clients={CLIENT: {"memory_enabled": True, "mode": "both"}})
    daemon_factory(config)
    chat = tmp_path / "chat.json"
    chat.write_text(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "Where is the spare key?"}],
                "response": {"role": "assistant", "content": "Under the blue pot."},
            }
        )
    )
    user = User(tmp_path)
    first = user.memd("record", CLIENT, "--chat", str(chat), "--config", str(config))
    assert first.code == 0 and first.out.startswith("recorded 2 new message(s) (new)"), first
    again = user.memd(
        "record", CLIENT, "--chat", "-", "--config", str(config), stdin=chat.read_text()
    )
    assert again.code == 0 and again.out.startswith("already recorded in session"), again
    assert "nothing written" in again.out


def test_status_and_sessions_show_restarts_and_failed_compactions(
    tmp_path: Path,
    config_file: Callable[..., Path],
    daemon_factory: Callable[..., DaemonProcess],
    fake: FakeLLM,
) -> None:
    fake.set_mode("error", status=500)
    config = config_file(
        session_inactivity_minutes=0.03,
        monitor_interval_seconds=0.2,
        compaction={
            "enabled": True,
            "llm_provider": "openai",
            "base_url": fake.base_url,
            "llm_model": "fake",
        },
        clients={CLIENT: {"memory_enabled": True, "mode": "both"}},
    )
    memd = daemon_factory(config)
    user = User(tmp_path)
    sid = memd.call(
        "memory.record_chat",
        {
            "client_id": CLIENT,
            "messages": [{"role": "user", "content": "FACT-boiler7?"}],
            "response": {"role": "assistant", "content": "Noted."},
        },
    )["session_id"]

    def client_status() -> dict[str, Any]:
        return memd.call("daemon.status")["clients"][CLIENT]

    wait_for(lambda: client_status()["compaction"]["failures"], "the compaction to fail", memd)
    watcher = wait_for(lambda: client_status()["watcher"]["pid"], "the watcher", memd)
    os.kill(watcher, signal.SIGKILL)
    wait_for(
        lambda: (
            client_status()["watcher"]["restarts"] == 1
            and client_status()["watcher"]["state"] == "RUNNING"
        ),
        "the watcher's restart",
        memd,
    )

    status = user.memd("status", "--config", str(config))
    assert status.code == 0, status.err
    assert "(1 restart)" in status.out and "restarts)" not in status.out
    assert "1 failed" in status.out and "needs attention:" in status.out
    assert f"session {sid}: compaction failed (1 attempt, next retry" in status.out
    assert "http_error: HTTP 500" in status.out
    assert "embedder RUNNING pid " in status.out  # the child holding the model

    listed = user.memd("sessions", "list", CLIENT, "--config", str(config))
    assert listed.code == 0, listed.err
    assert "COMPACTION" in listed.out and "failed (1 attempt)" in listed.out
    assert f"{sid}: compaction failed; next retry" in listed.out
    assert "http_error: HTTP 500" in listed.out

    # Piped, recompaction prints one plain line per session.
    fake.set_mode("ok")
    done = user.memd("sessions", "recompact", CLIENT, "--config", str(config))
    assert done.code == 0, done.err
    assert done.out == f"[1/1] {sid}: queued\n"


def test_the_printed_mcp_entry_starts_a_working_server(
    tmp_path: Path, config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    config = config_file(clients={CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}})
    daemon_factory(config)
    printed = User(tmp_path).memd("mcp", "--print-config", "--config", str(config))
    assert printed.code == 0, printed.err
    entry = json.loads(printed.out.split("\n\n", 1)[0])["mcpServers"]["_memory"]
    # As an MCP client starts it: no venv on PATH, no MEMD_CONFIG, another folder.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env, cwd="/")

    async def scenario() -> list[str]:
        with open(tmp_path / "mcp.log", "a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return [tool.name for tool in (await session.list_tools()).tools]

    assert anyio.run(scenario) == ["MemoryRecall"]
