"""`memd run`, `memd status` and `memd clients`: the daemon itself and how it is doing.

The human `status` shows everything that needs attention, not only the table: a rejected
config edit, children that failed (with their last error and log), and sessions whose
compaction keeps failing (with the error and the next retry). The daemon names its config
by absolute path, and a note says when this command read another one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from memd.cli.common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    call,
    config_source,
    duration,
    load,
    plural,
    table,
)
from memd.config import MEMORY_MODES
from memd.proxy import cli as proxy_cli
from memd.ui import cli as ui_cli


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `run`, `status` and `clients` to the `memd` subcommands."""
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run the daemon in the foreground",
        description="Run the daemon in the foreground until SIGINT/SIGTERM. Logs are "
        "structured lines on stderr (JSON when stderr is not a terminal); each client's "
        "watcher and index server log to <memory_dir>/<client>/.memd/logs/.",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.set_defaults(func=cmd_run)

    status = sub.add_parser("status", parents=[common], help="show the daemon and its clients")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.set_defaults(func=cmd_status)

    clients = sub.add_parser(
        "clients", parents=[common], help="list configured clients and whether memory is on"
    )
    clients.add_argument("--json", action="store_true", help="print the raw JSON")
    clients.add_argument(
        "--reset",
        metavar="CLIENT",
        help="restart a client's index server and watcher after they gave up (FATAL)",
    )
    clients.set_defaults(func=cmd_clients)


def cmd_run(args: argparse.Namespace) -> int:
    from memd.daemon import run_daemon
    from memd.logs import configure_logging
    from memd.rpc import SocketSetupError
    from memd.trust import UntrustedPath

    configure_logging(args.log_level)
    path, config = load(args)
    path = Path(os.path.abspath(path))  # status names it from any folder, unambiguously
    try:
        return run_daemon(path, config, services=proxy_cli.services() + ui_cli.services())
    except (SocketSetupError, UntrustedPath) as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def cmd_status(args: argparse.Namespace) -> int:
    status = call(args, "daemon.status")
    if args.json:
        print(json.dumps(status, indent=2))
        return EXIT_OK
    print(
        f"memd {status['version']}  pid {status['pid']}  "
        f"up {duration(status['uptime_seconds'])}  memory {footprint(status)}"
    )
    print(
        f"config   {status['config_path']}"
        + ("" if status["config_loaded"] else "  (not found: defaults)")
    )
    if status.get("config_error"):
        print(f"         last edit rejected: {status['config_error']}")
    if note := config_note(args, status["config_path"]):
        print(f"note     {note}")
    print(f"socket   {status['socket']}")
    print(f"memory   {status['memory_dir']}")
    if status.get("compaction"):
        print(f"compact  {compaction_line(status['compaction'])}")
    if status.get("proxy"):
        print(f"proxy    {proxy_cli.status_line(status['proxy'])}")
    if status.get("ui"):
        print(f"ui       {ui_cli.status_line(status['ui'])}")
    if status.get("embedder"):
        print(f"embedder {child_word(status['embedder'])}")
    rows = [status_row(cid, c) for cid, c in status["clients"].items()]
    print()
    print(
        table(
            ["CLIENT", "MODE", "MEMORY", "WATCHER", "INDEX", "SESSION", "COMPACTION", "REDACTED"],
            rows,
        )
        if rows
        else "no clients configured"
    )
    problems = [line for cid, c in status["clients"].items() for line in problem_lines(cid, c)]
    problems += problem_lines("memd", {"embedder": status.get("embedder")}, ("embedder",))
    if problems:
        print()
        print("needs attention:")
        print("\n".join(problems))
    return EXIT_OK


def config_note(args: argparse.Namespace, daemon_config: str) -> str | None:
    """A note when this command read another config than the daemon runs with (both
    reached the same socket): what the CLI says about clients is then not the daemon's."""
    mine, origin = config_source(getattr(args, "config", None))
    absolute = Path(os.path.abspath(mine))
    if Path(daemon_config) == absolute or not Path(daemon_config).is_absolute():
        return None
    return (
        f"this command read {absolute} ({origin}), not the daemon's config; pass "
        f"--config {daemon_config} (or set $MEMD_CONFIG) to use the same"
    )


def child_word(proc: dict[str, Any] | None) -> str:
    """A supervised child in one cell: its state, pid and restarts."""
    if not proc:
        return "-"
    text = str(proc.get("state", "?"))
    if proc.get("pid"):
        text += f" pid {proc['pid']}"
    if proc.get("restarts"):
        text += f" ({plural(proc['restarts'], 'restart')})"
    return text


def status_row(client_id: str, c: dict[str, Any]) -> list[str]:
    def child(name: str) -> str:
        return child_word(c.get(name))

    session = (c.get("active_session") or {}).get("session_id", "-")
    return [
        client_id,
        c["mode"],
        memory_word(c),
        child("watcher"),
        child("index_server"),
        session,
        compaction_word(c.get("compaction") or {}),
        redacted_word(c),
    ]


def redacted_word(c: dict[str, Any]) -> str:
    """Secrets redacted on record so far (counts only; `--json` has them by kind), and
    whether an index rebuild that drops removed text is under way."""
    counts = c.get("redacted")
    text = f"{sum(counts.values()):,}" if counts is not None else "-"
    return text + (" (index rebuilding)" if c.get("index_rebuilding") else "")


def compaction_line(comp: dict[str, Any]) -> str:
    """Compaction on or off, tokens today and overall, the cap, what waits for it."""
    if not comp.get("enabled"):
        return "off"
    text = f"on ({comp.get('llm_provider')} {comp.get('llm_model')})"
    tokens = comp.get("tokens") or {}
    for label, period in (("today", "today"), ("overall", "total")):
        used = tokens.get(period) or {}
        if used:
            text += f"  {label} {used['input_tokens']:,} in / {used['output_tokens']:,} out"
            if used.get("estimated_requests"):
                text += " (partly estimated)"
    cap = comp.get("cap") or {}
    if cap.get("max_input_tokens_per_day"):
        text += f"  cap {cap['max_input_tokens_per_day']:,}/day"
        if cap.get("reached"):
            text += f" REACHED until {cap['resets_at']}"
    if comp.get("deferred"):
        text += f"  {comp['deferred']} deferred"
    return text


def compaction_word(c: dict[str, Any]) -> str:
    """A client's compaction in one cell: tokens today, deferred, failed, the cap."""
    if not c:
        return "-"
    today = ((c.get("tokens") or {}).get("today") or {}).get("input_tokens", 0)
    text = f"{today:,} tok today"
    if c.get("deferred"):
        text += f", {c['deferred']} deferred"
    if c.get("failed"):
        text += f", {c['failed']} failed"
    if (c.get("cap") or {}).get("reached"):
        text += " (cap reached)"
    return text


def problem_lines(
    client_id: str, c: dict[str, Any], children: tuple[str, ...] = ("watcher", "index_server")
) -> list[str]:
    """What a human must see: client errors, failing children, failing compactions."""
    lines = []
    for key in ("client_error", "pipeline_error"):
        if c.get(key):
            lines.append(f"  {client_id}: {c[key]}")
    for name in children:
        proc = c.get(name) or {}
        if proc.get("last_error") and proc.get("state") in ("FATAL", "BACKOFF", "EXITED"):
            log = f" (log {proc['log_path']})" if proc.get("log_path") else ""
            lines.append(f"  {client_id} {name} {proc['state']}: {proc['last_error']}{log}")
            if proc.get("state") == "FATAL" and (said := last_words(proc.get("log_tail"))):
                lines.append(f"    its last log line: {said}")
    for failure in (c.get("compaction") or {}).get("failures", []):
        lines.append("  " + failure_line(client_id, failure))
    return lines


def last_words(tail: str | None) -> str:
    """A given-up child's last log line, its `error` alone when it is one of memd's JSON
    lines (a child that refuses to start says why there: a wrong engine version, say)."""
    last = next((line for line in reversed((tail or "").splitlines()) if line.strip()), "")
    try:
        record = json.loads(last)
    except ValueError:
        return last.strip()[:300]
    return str(record.get("error") or last)[:300] if isinstance(record, dict) else last[:300]


def failure_line(client_id: str, failure: dict[str, Any]) -> str:
    retry = f", next retry {failure['next_retry']}" if failure.get("next_retry") else ""
    attempts = plural(failure.get("attempts") or 0, "attempt")
    return (
        f"{client_id} session {failure['session_id']}: compaction failed "
        f"({attempts}{retry}): {failure.get('last_error') or 'no error recorded'}"
    )


def footprint(status: dict[str, Any]) -> str:
    """The whole tree's PSS (memd and every child), with memd's own RSS beside it."""
    own = f"{status['rss_bytes'] // 2**20} MB"
    if not status.get("tree_pss_bytes"):
        return f"{own} (memd alone)"
    children = status["tree_processes"] - 1
    return f"{status['tree_pss_bytes'] // 2**20} MB PSS with {children} children (memd {own})"


def memory_word(c: dict[str, Any]) -> str:
    if c["memory_on"]:
        return "on"
    if c["mode"] not in MEMORY_MODES and c.get("memory_enabled"):
        return "unsupported mode"
    return "off" if c.get("memory_enabled") is False else "off (unset)"


def cmd_clients(args: argparse.Namespace) -> int:
    if args.reset:
        reset = call(args, "clients.reset", {"client_id": args.reset})["reset"]
        print(f"{args.reset}: restarting" if reset else f"{args.reset}: nothing was FATAL")
        return EXIT_OK
    result = call(args, "clients.list")
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    rows = [[c["client_id"], c["mode"], memory_word(c)] for c in result["clients"]]
    print(table(["CLIENT", "MODE", "MEMORY"], rows) if rows else "no clients configured")
    return EXIT_OK
