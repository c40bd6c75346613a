"""`memd redact CLIENT [--dry-run] [--yes]`: scrub what a client already stored.

Through the running daemon (`memory.redact`), like `memd forget`. It first asks for a dry
run and shows what the current `[privacy]` rules would replace, by kind and by where
(transcripts, summaries, archive); it changes nothing unless the user then says yes
(`--yes` skips the question, and is required when stdin is not a terminal). Then it
rewrites exactly the files it showed, a few per call with a progress bar, and the last
call rebuilds the client's index, so no old text is left in `.memsearch/` either.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from memd.cli.client import MemdClient
from memd.cli.progress import Progress
from memd.config import socket_for

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
BATCH = 20  # files per call: record calls wait while one runs


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `redact` to the `memd` subcommands."""
    redact = sub.add_parser(
        "redact",
        parents=[common],
        help="apply the secret-scrubbing rules to what a client already stored",
        description="Replace recognised secrets in a client's transcripts, summaries and "
        "archive by [redacted: <kind>] markers (the current [privacy] rules), then rebuild "
        "its index so nothing of them is left. Shows what it found first.",
    )
    redact.add_argument("client", help="a client id (memory may be off for it)")
    redact.add_argument("--dry-run", action="store_true", help="only show what would change")
    redact.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    redact.add_argument("--json", action="store_true", help="print the raw JSON")
    redact.set_defaults(func=cmd_redact)


def cmd_redact(args: argparse.Namespace) -> int:
    socket, error = socket_for(args.config)
    if error is not None:
        print(f"memd: warning: {error}", file=sys.stderr)
    with MemdClient(socket, timeout=None) as client:
        plan = client.call("memory.redact", {"client_id": args.client, "dry_run": True})
        if args.json and args.dry_run:
            print(json.dumps(plan, indent=2))
            return EXIT_OK
        if not args.json:
            print(summary(plan, "would replace" if args.dry_run else "found"))
        if args.dry_run or not plan["total"]:
            return EXIT_OK
        if not args.yes:
            if not sys.stdin.isatty():
                print("memd: redact rewrites memory; pass --yes to confirm", file=sys.stderr)
                return EXIT_USAGE
            answer = input(f"Redact these in {args.client}'s memory? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing changed")
                return EXIT_OK
        done = apply(client, args.client, [f["file"] for f in plan["files"]], quiet=args.json)
    if args.json:
        print(json.dumps(done, indent=2))
    else:
        print(summary(done, "replaced"))
        print("index rebuilt" if done["index_rebuilt"] else "index unchanged")
    return EXIT_OK


def apply(client: MemdClient, client_id: str, files: list[str], quiet: bool) -> dict[str, Any]:
    """Rewrite `files` in batches (the last call also scrubs titles and rebuilds)."""
    batches = [files[i : i + BATCH] for i in range(0, len(files), BATCH)] or [[]]
    out: dict[str, Any] = {"files": [], "titles": 0, "total": 0, "index_rebuilt": False}
    with Progress(len(batches), "redacting", quiet=quiet) as progress:
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            params = {"client_id": client_id, "files": batch, "rebuild": last}
            part = client.call("memory.redact", params)
            out["files"] += part["files"]
            out["titles"] += part["titles"]
            out["total"] += part["total"]
            out["index_rebuilt"] = out["index_rebuilt"] or part["index_rebuilt"]
            progress.step(f"{len(part['files'])} file(s) rewritten")
    return out


def summary(result: dict[str, Any], verb: str) -> str:
    """Counts by kind and by where: never the secrets themselves."""
    if not result["total"]:
        return "no secrets found"
    where: dict[str, Counter[str]] = {}
    for row in result["files"]:
        place = _place(row["file"])
        where.setdefault(place, Counter()).update(row["kinds"])
    lines = [f"{verb} {result['total']} secret(s) in {len(result['files'])} file(s):"]
    for place, kinds in sorted(where.items()):
        listed = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
        lines.append(f"  {place}: {listed}")
    if result["titles"]:
        lines.append(f"  conversation titles: {result['titles']}")
    return "\n".join(lines)


def _place(name: str) -> str:
    if name.startswith("archive/"):
        return "archive"
    return "summaries" if name.endswith("-summary.md") else "transcripts"
