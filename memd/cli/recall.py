"""The `memd recall` and `memd mcp` commands: argv in, one daemon call or the MCP bridge out.

`memd.cli.main` registers them with `add_parsers(sub, common)`; errors (daemon down, refused
call) propagate as `ClientError`/`RemoteError`, which `memd.cli.main` turns into exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.cli.common import UsageError
from memd.config import socket_for


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `recall` and `mcp` to the `memd` subcommands."""
    recall = sub.add_parser(
        "recall",
        parents=[common],
        help="search a client's memory as its LLM would",
        description="Run the MemoryRecall tool for CLIENT and print what the LLM would read. "
        "Times: ISO date (2026-11-01), ISO datetime (2026-11-01T14:00, UTC unless "
        "an offset is given) or relative (30m, 6h, 2d, 1w before now).",
    )
    recall.add_argument("client", help="a client id with memory enabled")
    recall.add_argument("query", help="what to look for")
    recall.add_argument(
        "--top-k",
        type=int,
        metavar="N",
        help="how many memories (default: search_top_k from the config)",
    )
    recall.add_argument("--after", metavar="WHEN", help="only exchanges at or after WHEN")
    recall.add_argument("--before", metavar="WHEN", help="only exchanges before WHEN")
    recall.add_argument("--json", action="store_true", help="print the raw JSON")
    recall.set_defaults(func=cmd_recall)

    mcp = sub.add_parser(
        "mcp",
        parents=[common],
        help="serve a client's _memory tool as a stdio MCP server",
        description="Speak MCP on stdin/stdout, exposing the _memory server's recall tool "
        "for one client; every request is forwarded to the running daemon. With "
        "--print-config, print the entry that registers this server with an MCP client "
        "(absolute command, --config and --socket) as JSON on stdout, other clients' "
        "one-liners on stderr, and serve nothing.",
    )
    mcp.add_argument("--client", metavar="ID", help="the client id to serve")
    mcp.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's socket (default: from the config; without $XDG_RUNTIME_DIR, "
        "/run/user/UID/memd/memd.sock is looked at too)",
    )
    mcp.add_argument(
        "--print-config",
        action="store_true",
        help="print the MCP client config for this server (default client: the only one "
        "with memory on)",
    )
    mcp.set_defaults(func=cmd_mcp)


def _socket(args: argparse.Namespace) -> Any:
    socket, error = socket_for(args.config)
    if error is not None:
        print(f"memd: warning: {error}", file=sys.stderr)
    return socket


def cmd_recall(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"client_id": args.client, "query": args.query}
    for key in ("top_k", "after", "before"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    with MemdClient(_socket(args)) as client:
        try:
            result = client.call("memory.recall", params)
        except RemoteError as exc:
            if exc.kind != "unknown_client":
                raise
            raise UsageError(_unknown_client(args, client, exc)) from None
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(result["text"])
    return 0


def _unknown_client(args: argparse.Namespace, client: MemdClient, exc: RemoteError) -> str:
    """The daemon does not know the client: name the config it runs with, and say so
    when that is not the one this command was given (which may well list the client)."""
    from memd.cli.status import config_note

    try:
        daemon_config = client.call("daemon.status")["config_path"]
    except (RemoteError, ClientError, KeyError, TypeError):
        return str(exc.message)
    note = config_note(args, daemon_config)
    text = (
        f"unknown client {args.client!r} to the running daemon: add "
        f"[clients.{args.client}] to {daemon_config}, the config it runs with"
    )
    return text + (f"\n  note: {note}" if note else "")


def cmd_mcp(args: argparse.Namespace) -> int:
    from memd.cli import mcp_config
    from memd.cli.common import load
    from memd.cli.service_files import memd_command

    path, config = load(args)
    if args.print_config:
        client = mcp_config.pick_client(config, path, args.client)
        absolute = Path(os.path.abspath(path))
        socket = Path(os.path.abspath(args.socket or _socket(args)))
        block, notes = mcp_config.render(memd_command(), absolute, client, socket)
        print(block, end="")
        print(notes, end="", file=sys.stderr)
        return 0
    if not args.client:
        raise UsageError("give --client ID (or --print-config to see the MCP client entry)")
    mcp_config.check_client(config, path, args.client)  # fail now, not with empty tools

    from memd.cli.common import socket_origin
    from memd.cli.mcp import run_mcp, socket_candidates
    from memd.logs import configure_logging

    configure_logging("warning", json_lines=True)  # stderr; stdout is the MCP wire
    if args.socket:
        return run_mcp([Path(os.path.abspath(args.socket))], args.client, "given by --socket")
    from memd.config import default_socket_path

    socket, why = socket_origin(args.config)
    explicit = socket != default_socket_path(config.memory_dir)  # the `socket` key
    return run_mcp(socket_candidates(socket, explicit), args.client, why)
