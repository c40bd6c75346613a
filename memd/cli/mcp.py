"""`memd mcp --client ID`: a stdio MCP server named `_memory` that forwards to the daemon.

The server holds no memory logic: `tools/list` asks the daemon (`memory.tools`) and
`tools/call` forwards (`memory.call_tool`), both over memd's Unix socket with a fresh
`MemdClient` per request, run in a worker thread (the client blocks). So the tool's name
and schema follow the daemon's config (a reload renames it), and a daemon restart needs
no restart of this process. Stdout is the MCP wire; logs go to stderr.

When the daemon is down, `tools/list` fails with an MCP error saying so and `tools/call`
answers an `isError` result, so the LLM hears that memd is not running instead of hanging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import structlog
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from memd import __version__
from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.recall.tool import SERVER_NAME

log = structlog.get_logger()

CALL_TIMEOUT = 30.0  # the daemon bounds a recall at ~10 s; this is only a backstop
STARTUP_TIMEOUT = 5.0  # for fetching the instructions before the handshake
INTERNAL_ERROR = -32603


class DaemonBridge:
    """Blocking calls to the daemon for one client; each opens its own connection."""

    def __init__(self, socket_path: Path, client_id: str, timeout: float = CALL_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.client_id = client_id
        self.timeout = timeout

    def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        with MemdClient(self.socket_path, timeout=timeout or self.timeout) as client:
            return client.call(method, {"client_id": self.client_id, **params})

    def tools(self, timeout: float | None = None) -> dict[str, Any]:
        return self.call("memory.tools", {}, timeout)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.call("memory.call_tool", {"name": name, "arguments": arguments})


def not_running_text(exc: ClientError) -> str:
    return (
        f"Memory is unavailable: {exc}. Start the memd daemon (`memd run`, or its "
        "systemd/launchd service) and try again."
    )


def build_server(bridge: DaemonBridge, instructions: str | None = None) -> Server[Any]:
    """The `_memory` MCP server, its handlers forwarding to `bridge`."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            answer = await anyio.to_thread.run_sync(bridge.tools)
        except ClientError as exc:
            raise MCPError(INTERNAL_ERROR, not_running_text(exc)) from None
        except RemoteError as exc:
            raise MCPError(INTERNAL_ERROR, f"memd refused to list tools: {exc}") from None
        if not answer.get("memory_on") and answer.get("reason"):
            log.warning(
                "mcp.no_tools", client=bridge.client_id, reason=answer["reason"].get("message")
            )
        return types.ListToolsResult(
            tools=[types.Tool.model_validate(tool) for tool in answer.get("tools", [])]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            answer = await anyio.to_thread.run_sync(bridge.call_tool, params.name, arguments)
        except ClientError as exc:
            return _error_result(not_running_text(exc))
        except RemoteError as exc:
            return _error_result(f"memd refused the call: {exc.message}")
        return types.CallToolResult.model_validate(answer)

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=instructions or None,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def fetch_instructions(bridge: DaemonBridge) -> str | None:
    """The `_memory` instructions for this client, if the daemon answers at startup.

    MCP sends instructions once, in the handshake; a daemon that is down now leaves them
    out (tools/list still works once it is up).
    """
    try:
        return bridge.tools(timeout=STARTUP_TIMEOUT).get("instructions") or None
    except (ClientError, RemoteError) as exc:
        log.warning("mcp.no_instructions", client=bridge.client_id, error=str(exc))
        return None


async def serve(server: Server[Any]) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run_mcp(socket_path: Path, client_id: str) -> int:
    """Entry point of `memd mcp`: serve MCP on stdin/stdout until the client hangs up."""
    bridge = DaemonBridge(socket_path, client_id)
    server = build_server(bridge, fetch_instructions(bridge))
    log.info("mcp.serving", client=client_id, socket=str(socket_path))
    try:
        anyio.run(serve, server)
    except KeyboardInterrupt:
        return 130
    return 0
