"""`memd sessions list | close | recompact`: a client's sessions, ended or summarised again."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memd.cli.common import EXIT_ERROR, EXIT_OK, call, plural, table
from memd.cli.progress import Progress


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `sessions` and its actions to the `memd` subcommands."""
    sessions = sub.add_parser("sessions", parents=[common], help="list or end sessions")
    ssub = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    slist = ssub.add_parser("list", parents=[common], help="a client's sessions")
    slist.add_argument("client")
    slist.add_argument("--json", action="store_true", help="print the raw JSON")
    slist.set_defaults(func=cmd_list)
    sclose = ssub.add_parser("close", parents=[common], help="end the active session now")
    sclose.add_argument("client")
    sclose.add_argument("--json", action="store_true", help="print the raw JSON")
    sclose.set_defaults(func=cmd_close)
    srec = ssub.add_parser(
        "recompact",
        parents=[common],
        help="summarise again from the archive (one session or all)",
        description="Re-compact compacted sessions from their archived transcripts (after "
        "a change of compaction settings) and compact ended ones now. A progress bar "
        "shows on a terminal; otherwise one line per session.",
    )
    srec.add_argument("client")
    srec.add_argument("session", nargs="?", help="one session id (default: all)")
    srec.add_argument("--json", action="store_true", help="print the raw JSON")
    srec.set_defaults(func=cmd_recompact)


def cmd_list(args: argparse.Namespace) -> int:
    result = call(args, "sessions.list", {"client_id": args.client})
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    sessions = result["sessions"]
    rows = [
        [
            s["session_id"],
            s["state"],
            s["started"],
            s["last_activity"],
            str(s["conversations"]),
            compaction_cell(s.get("compaction")),
            s["path"],
        ]
        for s in sessions
    ]
    header = ["SESSION", "STATE", "STARTED", "LAST ACTIVITY", "CONVS", "COMPACTION", "PATH"]
    print(table(header, rows) if rows else "no sessions yet")
    failures = [s for s in sessions if (s.get("compaction") or {}).get("state") == "failed"]
    for s in failures:
        comp = s["compaction"]
        retry = f"; next retry {comp['next_retry']}" if comp.get("next_retry") else ""
        print(f"\n{s['session_id']}: compaction failed{retry}\n  {comp.get('last_error')}")
    return EXIT_OK


def compaction_cell(comp: dict[str, Any] | None) -> str:
    if not comp:
        return "-"
    if comp.get("running"):
        return "running"
    if comp.get("state") == "failed":
        return f"failed ({plural(comp.get('attempts') or 0, 'attempt')})"
    return str(comp.get("state", "-"))


def cmd_close(args: argparse.Namespace) -> int:
    result = call(args, "sessions.close", {"client_id": args.client})
    if args.json:
        print(json.dumps(result, indent=2))
    elif result["closed"]:
        for session in result["sessions"]:
            print(f"ended session {session['session_id']}")
    else:
        print("no active session")
    return EXIT_OK


def cmd_recompact(args: argparse.Namespace) -> int:
    """One call per session, so a long run shows progress and no call hits a timeout."""
    if args.session:
        targets = [args.session]
    else:
        rows = call(args, "sessions.list", {"client_id": args.client})["sessions"]
        targets = [r["session_id"] for r in rows if r["state"] in ("ended", "compacted")]
        if not targets:  # still ask: the daemon refuses while compaction is disabled
            call(args, "sessions.recompact", {"client_id": args.client})
    results = []
    with Progress(len(targets), "recompacting", quiet=args.json) as progress:
        for sid in targets:
            params = {"client_id": args.client, "session_id": sid}
            reply = call(args, "sessions.recompact", params, timeout=None)
            items = reply["results"]
            results.extend(items)
            progress.step("; ".join(_result_text(item) for item in items) or f"{sid}: -")
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    elif not targets:
        print("no ended or compacted sessions")
    return EXIT_ERROR if any(item["result"] == "failed" for item in results) else EXIT_OK


def _result_text(item: dict[str, Any]) -> str:
    error = f" ({item['error']})" if item.get("error") else ""
    return f"{item['session_id']}: {item['result']}{error}"
