"""`memd mcp --client ID`: a stdio MCP server named `_memory` that forwards to the daemon.

The server holds no memory logic: `tools/list` asks the daemon (`memory.tools`) and
`tools/call` forwards (`memory.call_tool`), both over memd's Unix socket with a fresh
`MemdClient` per request, run in a worker thread (the client blocks). So the tool's name
and schema follow the daemon's config (a reload renames it), and a daemon restart needs
no restart of this process. Stdout is the MCP wire; logs go to stderr.

When the daemon cannot be reached, `tools/list` fails with an MCP error saying so and
`tools/call` answers an `isError` result, so the LLM hears that memd is unavailable
instead of hanging. The socket is found without $XDG_RUNTIME_DIR, which MCP hosts do
not pass on: `--print-config` writes it into the entry (`--socket`), and without one the
usual runtime folder is looked at too (`socket_candidates`); when there is no socket,
the error says where it looked ("cannot find memd"), not that memd is down.
"""

from __future__ import annotations

import os
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
    """Blocking calls to the daemon for one client; each opens its own connection.

    `sockets` are the places the daemon may listen, tried in order at every call (the
    first that exists is used); `why` says how the first was chosen, for the error when
    none exists."""

    def __init__(
        self,
        socket_path: Path | list[Path],
        client_id: str,
        timeout: float = CALL_TIMEOUT,
        why: str = "",
    ) -> None:
        self.sockets = socket_path if isinstance(socket_path, list) else [socket_path]
        self.client_id = client_id
        self.timeout = timeout
        self.why = why

    @property
    def socket_path(self) -> Path:
        """The socket to use now: the first candidate that exists."""
        for path in self.sockets:
            if path.exists():
                return path
        raise ClientError(cannot_find_text(self.sockets, self.why), unreachable=True)

    def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        with MemdClient(self.socket_path, timeout=timeout or self.timeout) as client:
            return client.call(method, {"client_id": self.client_id, **params})

    def tools(self, timeout: float | None = None) -> dict[str, Any]:
        return self.call("memory.tools", {}, timeout)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.call("memory.call_tool", {"name": name, "arguments": arguments})


def socket_candidates(configured: Path, explicit: bool) -> list[Path]:
    """Where to look for the daemon. An MCP host starts servers with a minimal
    environment (the SDKs pass HOME, PATH, SHELL, TERM...), so $XDG_RUNTIME_DIR may be
    missing here while memd runs under it: unless the socket was named explicitly, the
    usual runtime folder of this uid is looked at too."""
    out = [configured]
    if not explicit and not os.environ.get("XDG_RUNTIME_DIR"):
        usual = Path(f"/run/user/{os.getuid()}") / "memd" / "memd.sock"
        if usual != configured:
            out.append(usual)
    return out


def cannot_find_text(sockets: list[Path], why: str) -> str:
    """No socket where memd was looked for: memd may be down, or listen elsewhere."""
    if len(sockets) == 1:
        where = f"no socket at {sockets[0]}, the only place looked" + (f" ({why})" if why else "")
    else:
        where = "no socket at " + ", nor at ".join(str(p) for p in sockets)
    return (
        f"cannot find memd: {where}. If memd runs, name its socket with --socket "
        "(`memd path --socket` prints it; `memd mcp --print-config` writes an entry with it)"
    )


def not_running_text(exc: ClientError) -> str:
    return (
        f"Memory is unavailable: {exc}. Start the memd daemon (`memd run`, or its "
        "systemd/launchd service) if it is not running, and try again."
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


def run_mcp(socket_path: Path | list[Path], client_id: str, why: str = "") -> int:
    """Entry point of `memd mcp`: serve MCP on stdin/stdout until the client hangs up."""
    bridge = DaemonBridge(socket_path, client_id, why=why)
    server = build_server(bridge, fetch_instructions(bridge))
    log.info("mcp.serving", client=client_id, sockets=[str(p) for p in bridge.sockets])
    try:
        anyio.run(serve, server)
    except KeyboardInterrupt:
        return 130
    return 0
