"""The `memd forget` and `memd export` commands (`memd import`: memd.cli.imports).

`forget` asks before removing anything (on a terminal; `--yes` skips the question, and
is required when stdin is not a terminal). With `--query` it first lists the exchanges
recall finds relevant (a dry run of `memory.forget`) and then forgets exactly those;
either way it prints what it removed, by time, place and title.
`export` streams every exchange page by page, as JSON lines or as markdown, so a whole
history is never held in memory; when the daemon cannot be reached it reads the same
exchanges from the client's files (they are the user's).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from memd.cli.client import ClientError, MemdClient
from memd.config import socket_for

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
TIMES = "ISO date or datetime (UTC unless an offset is given) or relative (30m, 6h, 2d, 1w)"


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `forget` and `export` to the `memd` subcommands."""
    forget = sub.add_parser(
        "forget",
        parents=[common],
        help="remove exchanges from a client's memory for good",
        description="Remove exchanges from transcripts, archive, summaries, state and index "
        f"(the text is physically gone). Give exactly one selector. Times: {TIMES}.",
    )
    forget.add_argument("client", help="a client id (memory may be off for it)")
    forget.add_argument("--session", metavar="ID", help="a whole session")
    forget.add_argument(
        "--conversation", metavar="ID", help="an MCP conversation id, or with --session its number"
    )
    forget.add_argument("--after", metavar="WHEN", help="exchanges at or after WHEN")
    forget.add_argument("--before", metavar="WHEN", help="exchanges before WHEN")
    forget.add_argument(
        "--query",
        metavar="TEXT",
        help="the exchanges recall finds relevant to TEXT (refused when none is)",
    )
    forget.add_argument("--all", action="store_true", help="everything of this client")
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    forget.add_argument("--json", action="store_true", help="print the raw JSON")
    forget.set_defaults(func=cmd_forget)

    export = sub.add_parser(
        "export",
        parents=[common],
        help="write every exchange of a client to stdout",
        description=f"Every exchange, archived and active alike, oldest first. Times: {TIMES}.",
    )
    export.add_argument("client", help="a client id (memory may be off for it)")
    export.add_argument("--format", choices=["jsonl", "markdown"], default="jsonl")
    export.add_argument("--after", metavar="WHEN", help="exchanges at or after WHEN")
    export.add_argument("--before", metavar="WHEN", help="exchanges before WHEN")
    export.set_defaults(func=cmd_export)


def _client(args: argparse.Namespace, timeout: float | None = 60.0) -> MemdClient:
    socket, error = socket_for(args.config)
    if error is not None:
        print(f"memd: warning: {error}", file=sys.stderr)
    return MemdClient(socket, timeout=timeout)


def forget_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"client_id": args.client}
    conversation: str | int | None = args.conversation
    if args.conversation is not None and args.session and args.conversation.isdigit():
        conversation = int(args.conversation)
    for key, value in (
        ("session_id", args.session),
        ("conversation_id", conversation),
        ("after", args.after),
        ("before", args.before),
        ("query", args.query),
    ):
        if value is not None:
            params[key] = value
    if args.all:
        params["all"] = True
    return params


def cmd_forget(args: argparse.Namespace) -> int:
    params = forget_params(args)
    with _client(args, timeout=None) as client:
        if not args.yes:
            if not sys.stdin.isatty():
                print(
                    "memd: forget removes memory for good; pass --yes to confirm", file=sys.stderr
                )
                return EXIT_USAGE
            if args.query is not None:
                preview = client.call("memory.forget", {**params, "dry_run": True})
                print("These exchanges are relevant to the query:")
                _print_listed(preview)
                if preview["forgotten"]:  # never more than was shown
                    params = _exact(args.client, preview)
            answer = input(f"Forget {_what(args)} of {args.client} for good? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing forgotten")
                return EXIT_OK
        result = client.call("memory.forget", params)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        r = result["removed"]
        print(
            f"forgot {r['exchanges']} exchange(s): {r['files']} file(s) changed, "
            f"{r['index_rows']} index row(s) dropped"
        )
        _print_listed(result)
    return EXIT_OK


def _print_listed(result: dict[str, Any]) -> None:
    """One line per exchange a forget names: when, where, and its conversation's title."""
    for e in result.get("forgotten", []):
        title = f" — {e['title']}" if e.get("title") else ""
        print(
            f"  {e['time']} · session {e['session_id']} · conversation {e['conversation']}"
            f" · exchange {e['exchange']}{title}"
        )
    if result.get("forgotten_more"):
        print(f"  … and {result['forgotten_more']} more")


def _exact(client_id: str, preview: dict[str, Any]) -> dict[str, Any]:
    """memory.forget params for exactly the exchanges a dry run listed."""
    keys = [
        {k: e[k] for k in ("session_id", "conversation", "exchange")} for e in preview["forgotten"]
    ]
    return {"client_id": client_id, "exchanges": keys}


def _what(args: argparse.Namespace) -> str:
    if args.all:
        return "ALL memory"
    if args.query is not None:
        return "the exchanges shown above"
    if args.conversation is not None:
        return f"conversation {args.conversation}"
    if args.session is not None:
        return f"session {args.session}"
    return "the exchanges " + " ".join(
        s
        for s in (
            f"from {args.after}" if args.after else "",
            f"before {args.before}" if args.before else "",
        )
        if s
    )


def pages(client: MemdClient, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every exchange memory.export returns, one page in memory at a time."""
    cursor: str | None = None
    while True:
        page = client.call("memory.export", {**params, **({"cursor": cursor} if cursor else {})})
        yield from page["exchanges"]
        cursor = page.get("next_cursor")
        if not cursor:
            return


def cmd_export(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    params: dict[str, Any] = {"client_id": args.client}
    for key in ("after", "before"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    session = None
    for record in _exported(args, params):
        if args.format == "jsonl":
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            continue
        if record["session_id"] != session:
            session = record["session_id"]
            out.write(f"# Session {session}\n\n")
        out.write(_markdown(record))
    return EXIT_OK


def _exported(args: argparse.Namespace, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every exchange, from the daemon, or from the files when the daemon cannot be
    reached (they are the user's; a daemon that goes away mid-export is an error)."""
    try:
        client = _client(args)
        client.connect()
    except ClientError as exc:
        if not exc.unreachable:
            raise
        print(f"memd: {exc}; exporting from the files", file=sys.stderr)
        yield from _from_files(args)
        return
    try:
        yield from pages(client, params)
    finally:
        client.close()


def _from_files(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """What memory.export would return, read from the client's folder directly."""
    from datetime import UTC, datetime

    from memd.access import check_client_id
    from memd.cli.common import UsageError, load
    from memd.errors import RpcError
    from memd.layout import ClientLayout
    from memd.privacy.export import iter_exchanges, stored_conversation_ids
    from memd.recall import RecallArgumentError, parse_time

    _, config = load(args)
    now = datetime.now(UTC)
    try:
        check_client_id(args.client)
        after = parse_time(args.after, "after", now) if args.after else None
        before = parse_time(args.before, "before", now) if args.before else None
    except (RpcError, RecallArgumentError) as exc:
        raise UsageError(str(getattr(exc, "message", exc))) from None
    layout = ClientLayout(config.memory_dir, args.client)
    if not layout.root.is_dir():
        if args.client in config.clients:
            return  # configured, nothing recorded yet
        raise UsageError(f"unknown client {args.client!r}: no memory folder at {layout.root}")
    ids = stored_conversation_ids(layout)
    for _, record in iter_exchanges(layout, ids, after=after, before=before):
        yield record


def _markdown(record: dict[str, Any]) -> str:
    head = f"## {record['time']} · conversation {record['conversation']}"
    if record.get("conversation_id"):
        head += f" ({record['conversation_id']})"
    body = "".join(f"**{p['label']}:** {p['text']}\n\n" for p in record["parts"])
    return f"{head} · exchange {record['exchange']}\n\n{body}"
