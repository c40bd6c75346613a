"""`memd mcp --client ID` driven by the official MCP SDK client over stdio, against a real daemon.

The SDK's `stdio_client` spawns `python -m memd.cli mcp ...`, `ClientSession` does the
handshake, lists and calls the tool; the daemon behind it is a real `memd run` with real
watchers and index servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from tests.support.daemon import DaemonProcess, base_config, write_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WAIT = 60.0


@asynccontextmanager
async def mcp_session(config: Path, client_id: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK session with `memd mcp` for one client."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memd.cli", "mcp", "--client", client_id, "--config", str(config)],
        env={**os.environ, "HOME": str(config.parent / "home")},
        cwd=REPO,
    )
    with open(config.parent / f"mcp-{client_id}.log", "a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            yield session


def run(fn: Callable[[], Any]) -> Any:
    return anyio.run(fn)


def text_of(result: Any) -> str:
    [block] = result.content
    assert block.type == "text"
    return block.text


async def poll(fn: Callable[[], Any], done: Callable[[Any], bool], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        value = await fn()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {value!r}")
        await anyio.sleep(0.3)


def test_list_and_call_the_recall_tool(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    config = config_file(clients={"alice": {"memory_enabled": True, "mode": "mcp_via_llm"}})
    daemon = daemon_factory(config)
    daemon.call(
        "memory.record_exchange",
        {
            "client_id": "alice",
            "conversation_id": "c1",
            "user": "Which bus goes to the zoo? 🦒",
            "assistant": "Bus 42 goes to the zoo.",
            "timestamp": "2026-11-05T09:00:00Z",
        },
    )

    async def scenario() -> None:
        async with mcp_session(config, "alice") as session:
            init = await session.initialize()
            assert init.server_info.name == "_memory"
            assert init.instructions and "MemoryRecall" in init.instructions
            assert init.capabilities.tools is not None
            tools = (await session.list_tools()).tools
            assert [t.name for t in tools] == ["MemoryRecall"]
            schema = tools[0].input_schema
            assert schema["required"] == ["query"]
            assert set(schema["properties"]) == {"query", "top_k", "after", "before"}

            async def ask() -> Any:
                return await session.call_tool(
                    "MemoryRecall", {"query": "bus to the zoo", "top_k": 1}
                )

            found = await poll(
                ask,
                lambda r: not r.is_error and "Bus 42" in text_of(r),
                "the exchange to be indexed",
            )
            assert text_of(found).startswith("Found 1 memory")
            assert "🦒" in text_of(found) and str(config.parent) not in text_of(found)
            filtered = await session.call_tool(
                "MemoryRecall", {"query": "zoo", "after": "2026-11-05T09:00:01Z"}
            )
            assert not filtered.is_error
            assert text_of(filtered) == "No relevant memories found."
            bad = await session.call_tool("MemoryRecall", {"query": "zoo", "before": "soon"})
            assert bad.is_error and "30m" in text_of(bad) and "2026-11-01" in text_of(bad)
            unknown = await session.call_tool("Forget", {"query": "zoo"})
            assert unknown.is_error and "Unknown tool 'Forget'" in text_of(unknown)

    run(scenario)


def test_client_without_memory_is_refused_at_start(
    config_file: Callable[..., Path], daemon_factory: Callable[..., DaemonProcess]
) -> None:
    """An MCP client shows the server's start-up error, instead of a server with no tools."""
    config = config_file(
        clients={
            "alice": {"memory_enabled": True},
            "bob": {"memory_enabled": False},
            "carol": {"memory_enabled": True, "mode": "llm_only"},
        }
    )
    daemon_factory(config)
    for client_id, words in (
        ("bob", "memory_enabled is false"),
        ("carol", "llm_only"),
        ("dave", "is not in"),
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "memd.cli",
                "mcp",
                "--client",
                client_id,
                "--config",
                str(config),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "HOME": str(config.parent / "home")},
            check=False,
        )
        assert done.returncode == 2 and done.stdout == "", (client_id, done)
        assert client_id in done.stderr and words in done.stderr, (client_id, done.stderr)


def test_tool_rename_shows_after_config_reload(
    tmp_path: Path, daemon_factory: Callable[..., DaemonProcess]
) -> None:
    data = base_config(tmp_path, clients={"alice": {"memory_enabled": True}})
    config = write_config(tmp_path / "config.toml", data)
    daemon = daemon_factory(config)
    # The socket answers before the config watcher runs; an edit made earlier goes unseen.
    deadline = time.monotonic() + WAIT
    while "memd.ready" not in daemon.log():
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)

    async def scenario() -> None:
        async with mcp_session(config, "alice") as session:
            await session.initialize()
            assert [t.name for t in (await session.list_tools()).tools] == ["MemoryRecall"]
            write_config(config, {**data, "recall_tool_name": "Remember", "search_top_k": 3})

            async def names() -> Any:
                return [
                    (t.name, t.input_schema["properties"]["top_k"]["default"])
                    for t in (await session.list_tools()).tools
                ]

            await poll(names, lambda n: n == [("Remember", 3)], "the rename to apply")
            old = await session.call_tool("MemoryRecall", {"query": "q"})
            assert old.is_error and "'Remember'" in text_of(old)
            new = await session.call_tool("Remember", {"query": "q"})
            assert "Unknown tool" not in text_of(new)

    run(scenario)


def test_daemon_down_is_reported_not_hung(config_file: Callable[..., Path]) -> None:
    config = config_file(clients={"alice": {"memory_enabled": True}})

    async def scenario() -> None:
        async with mcp_session(config, "alice") as session:
            init = await session.initialize()
            assert init.server_info.name == "_memory"
            with pytest.raises(MCPError, match="cannot find memd"):
                await session.list_tools()
            result = await session.call_tool("MemoryRecall", {"query": "zoo"})
            assert result.is_error and "cannot find memd" in text_of(result)
            assert "memd run" in text_of(result)

    run(scenario)
