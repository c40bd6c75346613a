"""JSON-RPC methods of recall: `memory.recall`, `memory.tools`, `memory.call_tool`.

`memory.recall` is for programs: a bad argument is a -32602, an index that is not
there (yet) is an `IndexUnavailable` error. `memory.tools` and `memory.call_tool` serve
the `_memory` MCP server to gateways and to `memd mcp`: a tool call never fails at the
JSON-RPC level for what happens inside the tool (bad arguments, memory off, index down);
it answers an MCP `CallToolResult` with `isError: true` and text the LLM can read. Only
malformed params (wrong types, a client id that can never exist) are JSON-RPC errors.

The tool name and default top_k are read from `app.runtime.config` on every call, so a config
reload renames the tool at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from memd import recall as rc
from memd.access import check_client_id, memory_client
from memd.api.app import ApiHandler, App
from memd.errors import Busy, IndexUnavailable, InvalidParams, MemdError, Timeout
from memd.indexing import IndexUnavailableError
from memd.rpc import JsonParams, Params

log = structlog.get_logger()

UNAVAILABLE_TEXT = (
    "Memory is not available right now: the memory index is starting or "
    "restarting. Try again in a moment."
)
BUSY_TEXT = "Memory recall timed out because memd is busy right now. Try again in a moment."
FAILED_TEXT = "Memory recall failed with an internal error (details are in memd's log)."


async def memory_recall(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.recall`: a search for programs; bad arguments are -32602, the rest kinds."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        query = p.require("query", str)
        top_k = p.optional("top_k", int)
        after = p.optional("after", str)
        before = p.optional("before", str)
    runtime = await app.runtime.client(client_id)
    arguments = {"query": query, "top_k": top_k, "after": after, "before": before}
    try:
        args = rc.parse_arguments(arguments, app.runtime.config.search_top_k)
    except rc.RecallArgumentError as exc:
        raise InvalidParams(exc.message, data={"param": exc.param}) from None
    try:
        return await rc.recall(
            getattr(runtime, "searcher", None),
            args.query,
            args.top_k,
            args.after,
            args.before,
            runtime.layout,
            waiting=app.runtime.config.limits.recall_queue,
            settings=app.runtime.config.recall,
            lane=runtime.recall_lane,
        )
    except (rc.RecallBusyError, IndexUnavailableError, rc.RecallTimeoutError) as exc:
        raise _recall_error(client_id, exc) from None


def _recall_error(client_id: str, exc: Exception) -> MemdError:
    """The domain error a caller of `memory.recall` gets for a search that could not run."""
    data = {"client_id": client_id}
    if isinstance(exc, rc.RecallBusyError):
        log.warning("recall.busy", client=client_id, error=str(exc))
        return Busy(f"recall for client {client_id!r} is busy: {exc}; retry shortly", data=data)
    if isinstance(exc, IndexUnavailableError):
        log.warning("recall.unavailable", client=client_id, error=str(exc))
        return IndexUnavailable(
            f"the memory index of client {client_id!r} is not available (starting, "
            "restarting or not answering); retry shortly",
            data=data,
        )
    log.warning("recall.timeout", client=client_id, error=str(exc))
    return Timeout(f"recall for client {client_id!r} timed out: {exc}; retry shortly", data=data)


async def memory_tools(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.tools`: the `_memory` MCP server as one client sees it."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
    return tools_for(app, client_id)


async def memory_call_tool(app: App, params: JsonParams) -> dict[str, Any]:
    """`memory.call_tool`: run a `_memory` tool; what fails inside it is a tool result."""
    with Params(params) as p:
        client_id = p.require("client_id", str)
        name = p.require("name", str)
        arguments = p.optional("arguments", dict, {})
    check_client_id(client_id)
    return await call_tool(app, client_id, name, arguments)


METHODS: Mapping[str, ApiHandler] = {
    "memory.recall": memory_recall,
    "memory.tools": memory_tools,
    "memory.call_tool": memory_call_tool,
}


def tools_for(app: App, client_id: str) -> dict[str, Any]:
    """The `_memory` server as one client sees it; no tools when memory is off for it.

    Memory off (unknown client, disabled, unsupported mode) is an answer, not an error:
    a gateway lists tools for every client it serves. `reason` says why the list is empty.
    """
    check_client_id(client_id)
    config = app.runtime.config
    try:
        memory_client(config, client_id)
    except MemdError as exc:
        return {
            "server": rc.SERVER_NAME,
            "tools": [],
            "instructions": "",
            "memory_on": False,
            "reason": {"kind": exc.kind, "message": exc.message},
        }
    name = config.recall_tool_name
    return {
        "server": rc.SERVER_NAME,
        "tools": [rc.tool_definition(name, config.search_top_k)],
        "instructions": rc.instructions(name),
        "memory_on": True,
        "reason": None,
    }


async def call_tool(
    app: App, client_id: str, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """Run a `_memory` tool for a client and answer in MCP's CallToolResult shape."""
    try:
        runtime = await app.runtime.client(client_id)
    except MemdError as exc:
        return tool_result(f"Memory is not available for this client: {exc.message}", error=True)
    config = app.runtime.config
    if name != config.recall_tool_name:
        return tool_result(
            f"Unknown tool {name!r} on {rc.SERVER_NAME}; its only tool is "
            f"{config.recall_tool_name!r}.",
            error=True,
        )
    try:
        args = rc.parse_arguments(arguments, config.search_top_k)
    except rc.RecallArgumentError as exc:
        return tool_result(f"Invalid arguments for {name}: {exc.message}", error=True)
    try:
        result = await rc.recall(
            getattr(runtime, "searcher", None),
            args.query,
            args.top_k,
            args.after,
            args.before,
            runtime.layout,
            waiting=config.limits.recall_queue,
            settings=config.recall,
            lane=runtime.recall_lane,
        )
    except IndexUnavailableError as exc:
        log.warning("recall.unavailable", client=client_id, error=str(exc))
        return tool_result(UNAVAILABLE_TEXT, error=True)
    except (rc.RecallTimeoutError, rc.RecallBusyError) as exc:
        log.warning("recall.timeout", client=client_id, error=str(exc))
        return tool_result(BUSY_TEXT, error=True)
    except Exception:
        log.exception("recall.failed", client=client_id)
        return tool_result(FAILED_TEXT, error=True)
    return tool_result(result["text"])


def tool_result(text: str, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}
