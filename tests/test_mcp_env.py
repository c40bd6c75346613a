"""`memd mcp` started the way MCP hosts start servers: the SDK's minimal environment.

The official SDKs spawn a stdio server with only HOME, PATH, SHELL, TERM and the like
(`mcp.client.stdio.get_default_environment`), so $XDG_RUNTIME_DIR, where the daemon's
socket usually is, is missing. The entry `memd mcp --print-config` prints (pure JSON on
stdout, piped through a JSON parser as `jq` would) must work as is under that
environment; an entry without the socket says it cannot find memd and where it looked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from memd.recall.tool import SERVER_NAME
from tests.support.daemon import DaemonProcess, write_config

pytestmark = pytest.mark.slow


def test_printed_entry_works_without_xdg_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon_factory: Callable[..., DaemonProcess]
) -> None:
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    config = write_config(
        tmp_path / "config.toml",
        {"memory_dir": str(tmp_path / "memory"), "clients": {"alice": {"memory_enabled": True}}},
    )
    daemon_factory(config)
    assert (runtime / "memd" / "memd.sock").exists()  # the default place, by the variable

    printed = subprocess.run(
        [sys.executable, "-m", "memd.cli", "mcp", "--print-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path / "home")},
    )
    assert printed.returncode == 0, printed.stderr
    entry = json.loads(printed.stdout)["mcpServers"][SERVER_NAME]  # nothing but JSON
    assert "claude mcp add" in printed.stderr

    async def tools(args: list[str]) -> list[str] | str:
        # env=None: the SDK's own default environment, as Claude Desktop and others use
        params = StdioServerParameters(command=entry["command"], args=args, cwd=tmp_path)
        with open(tmp_path / "mcp.log", "a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                try:
                    return [t.name for t in (await session.list_tools()).tools]
                except MCPError as exc:
                    return str(exc)

    assert anyio.run(tools, entry["args"]) == ["MemoryRecall"]

    # An entry without --socket, under the same environment: it cannot find memd, and
    # says so (not that memd is down), naming where it looked.
    bare = entry["args"][: entry["args"].index("--socket")]
    message = anyio.run(tools, bare)
    assert isinstance(message, str)
    assert "cannot find memd" in message and "not running" not in message.split(".")[0]
    assert str(tmp_path / "memory" / "memd.sock") in message
