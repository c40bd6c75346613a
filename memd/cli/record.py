"""`memd record`: one exchange or one chat call, recorded by hand or from a script.

A record refused with `busy` (memd is forgetting from that client's memory) has written
nothing: it is sent again after the hinted `retry_after`, for up to BUSY_PATIENCE
seconds, so an import script does not stop at a forget; past that the error is shown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from memd.cli.client import RemoteError
from memd.cli.common import EXIT_OK, UsageError, call

BUSY_PATIENCE = 60.0  # seconds a record refused with `busy` is sent again (said in --help)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `record` to the `memd` subcommands."""
    record = sub.add_parser(
        "record",
        parents=[common],
        help="record an exchange (mcp_via_llm) or a chat call (both) for a client",
        description="Record one user/assistant exchange with --conversation/--user/"
        "--assistant, or one OpenAI chat call with --chat FILE (a JSON object "
        "with 'messages' and 'response'; '-' reads stdin). A record refused with "
        "'busy' (a forget is rewriting the client's files) is sent again for up to 60 s.",
    )
    record.add_argument("client", help="a client id with memory enabled")
    record.add_argument("--conversation", metavar="ID", help="MCP-via-LLM session id")
    record.add_argument("--user", metavar="TEXT", help="the user's message")
    record.add_argument("--assistant", metavar="TEXT", help="the assistant's reply")
    record.add_argument("--chat", metavar="FILE", help="JSON file with messages and response")
    record.add_argument(
        "--exchange-id",
        metavar="ID",
        help="idempotency key of the exchange, unique within its conversation: "
        "recording it again writes nothing",
    )
    record.add_argument("--timestamp", metavar="ISO", help="when it happened (for imports)")
    record.add_argument("--json", action="store_true", help="print the raw JSON")
    record.set_defaults(func=cmd_record)


def cmd_record(args: argparse.Namespace) -> int:
    method, params = chat_params(args) if args.chat else exchange_params(args)
    if args.timestamp:
        params["timestamp"] = args.timestamp
    result = call_patiently(args, method, params)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(describe(result))
    return EXIT_OK


def call_patiently(args: argparse.Namespace, method: str, params: dict[str, Any]) -> Any:
    """The call, sent again while memd answers `busy` with a retry hint (nothing written)."""
    deadline = time.monotonic() + BUSY_PATIENCE
    while True:
        try:
            return call(args, method, params)
        except RemoteError as exc:
            wait = exc.data.get("retry_after") if isinstance(exc.data, dict) else None
            if exc.kind != "busy" or not isinstance(wait, int | float) or wait <= 0:
                raise
            if time.monotonic() + wait > deadline:
                raise
            print(f"memd: busy, trying again in {wait:g} s: {exc.message}", file=sys.stderr)
            time.sleep(wait)


def chat_params(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if any(v is not None for v in (args.conversation, args.user, args.assistant, args.exchange_id)):
        raise UsageError(
            "use either --chat or --conversation/--user/--assistant "
            "(--exchange-id goes with the latter)"
        )
    body = read_json(args.chat)
    if not isinstance(body, dict) or set(body) - {"messages", "response"}:
        raise UsageError("--chat needs a JSON object with 'messages' and 'response'")
    return "memory.record_chat", {"client_id": args.client, **body}


def exchange_params(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if not (args.conversation and args.user is not None and args.assistant is not None):
        raise UsageError("give --conversation, --user and --assistant (or --chat FILE)")
    params = {
        "client_id": args.client,
        "conversation_id": args.conversation,
        "user": args.user,
        "assistant": args.assistant,
    }
    if args.exchange_id is not None:
        params["exchange_id"] = args.exchange_id
    return "memory.record_exchange", params


def describe(result: dict[str, Any]) -> str:
    """One line that says whether anything was written (a chat call's `match` says so)."""
    where = f"session {result['session_id']}, conversation {result['conversation']}"
    if result.get("duplicate") or result.get("match") == "duplicate":
        return f"already recorded in {where}; nothing written"
    if "appended" in result:
        return f"recorded {result['appended']} new message(s) ({result['match']}) in {where}"
    return f"recorded in {where}"


def read_json(source: str) -> Any:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        return json.loads(text)
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from exc
