"""`memd mcp --print-config`: the exact snippet that registers `memd mcp` with MCP clients,
and the start-up check that refuses to serve a client without memory.

An MCP client spawns the server itself, with its own environment and working folder, so
the snippet names memd by absolute path (a bare `memd` fails with ENOENT for a venv
install) and passes `--config` and `--socket` explicitly: the client's environment has no
$MEMD_CONFIG, and the MCP SDKs start servers without $XDG_RUNTIME_DIR, where the
daemon's socket usually is.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from memd.cli.common import UsageError
from memd.config import Config
from memd.recall.tool import SERVER_NAME


def server_entry(
    command: tuple[str, ...], config_path: Path, client: str, socket: Path | None = None
) -> dict[str, Any]:
    """One `mcpServers` entry: how an MCP client starts `memd mcp` for `client`."""
    args = [*command[1:], "mcp", "--client", client, "--config", str(config_path)]
    if socket is not None:
        args += ["--socket", str(socket)]
    return {"command": command[0], "args": args}


def render(
    command: tuple[str, ...], config_path: Path, client: str, socket: Path | None = None
) -> tuple[str, str]:
    """The JSON block for Claude Desktop-style configs (pure JSON, for stdout and `jq`),
    and the one-line equivalents as comments (for stderr)."""
    entry = server_entry(command, config_path, client, socket)
    block = json.dumps({"mcpServers": {SERVER_NAME: entry}}, indent=2)
    argv = shlex.join([entry["command"], *entry["args"]])
    notes = (
        f"# Claude Code:\nclaude mcp add {SERVER_NAME} -- {argv}\n\n"
        "# MCP Inspector (the server's own options go after --):\n"
        f"npx @modelcontextprotocol/inspector -- {argv}\n"
    )
    return block + "\n", notes


def pick_client(config: Config, config_path: Path, client: str | None) -> str:
    """The client to print for: the one given (checked), or the only one with memory on."""
    if client is not None:
        check_client(config, config_path, client)
        return client
    enabled = sorted(config.enabled_clients())
    if len(enabled) == 1:
        return enabled[0]
    if not enabled:
        raise UsageError(
            f"no client in {_named(config, config_path)} has memory on; "
            "`memd init --client ID` writes a config with one"
        )
    raise UsageError(
        f"several clients have memory on ({', '.join(enabled)}); pick one with --client ID"
    )


def check_client(config: Config, config_path: Path, client: str) -> None:
    """Refuse a client that `memd mcp` could only serve an empty tool list for."""
    where = _named(config, config_path)
    known = config.clients.get(client)
    if known is None:
        names = ", ".join(sorted(config.clients)) or "none"
        raise UsageError(
            f"client {client!r} is not in {where} (configured: {names}); "
            "pass the daemon's config with --config, or add the client"
        )
    if known.memory_on:
        return
    if known.memory_enabled is not True:
        state = "false" if known.memory_enabled is False else "unset"
        raise UsageError(
            f"memory is off for client {client!r} in {where} "
            f"(memory_enabled is {state}); set memory_enabled = true"
        )
    raise UsageError(
        f"client {client!r} in {where} is mode {known.mode}, which cannot "
        "have memory; use mode mcp_via_llm or both"
    )


def _named(config: Config, config_path: Path) -> str:
    return str(config_path) if config.source else f"the defaults (no file at {config_path})"
