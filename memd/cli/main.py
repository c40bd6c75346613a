"""The `memd` command: parses argv and calls one library entry point per command."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memd import __version__
from memd.cli import recall as recall_cli
from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.config import Config, ConfigError, load_config, resolve_config_path, socket_for

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class UsageError(Exception):
    """Arguments that parse but make no sense together."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $MEMD_CONFIG, else ~/.config/memd/config.toml)",
    )
    parser = argparse.ArgumentParser(
        prog="memd", parents=[common], description="Persistent conversation memory for LLM clients."
    )
    parser.add_argument("--version", action="version", version=f"memd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", parents=[common], help="run the daemon in the foreground")
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

    record = sub.add_parser(
        "record",
        parents=[common],
        help="record an exchange (mcp_via_llm) or a chat call (both) for a client",
        description="Record one user/assistant exchange with --conversation/--user/"
        "--assistant, or one OpenAI chat call with --chat FILE (a JSON object "
        "with 'messages' and 'response'; '-' reads stdin).",
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

    sessions = sub.add_parser("sessions", parents=[common], help="list or end sessions")
    ssub = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    slist = ssub.add_parser("list", parents=[common], help="a client's sessions")
    slist.add_argument("client")
    slist.add_argument("--json", action="store_true", help="print the raw JSON")
    slist.set_defaults(func=cmd_sessions_list)
    sclose = ssub.add_parser("close", parents=[common], help="end the active session now")
    sclose.add_argument("client")
    sclose.add_argument("--json", action="store_true", help="print the raw JSON")
    sclose.set_defaults(func=cmd_sessions_close)
    srec = ssub.add_parser(
        "recompact",
        parents=[common],
        help="summarise again from the archive (one session or all)",
        description="Re-compact compacted sessions from their archived transcripts (after "
        "a change of compaction settings) and compact ended ones now. "
        "Progress is printed per session.",
    )
    srec.add_argument("client")
    srec.add_argument("session", nargs="?", help="one session id (default: all)")
    srec.add_argument("--json", action="store_true", help="print the raw JSON")
    srec.set_defaults(func=cmd_sessions_recompact)

    path = sub.add_parser(
        "path", parents=[common], help="print the memory folder (or one client's)"
    )
    path.add_argument("client", nargs="?", help="a client id")
    path.set_defaults(func=cmd_path)

    opener = sub.add_parser(
        "open", parents=[common], help="open the memory folder in the desktop file manager"
    )
    opener.add_argument("client", nargs="?", help="a client id")
    opener.set_defaults(func=cmd_open)

    recall_cli.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ConfigError as exc:
        print(f"memd: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except RemoteError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _config(args: argparse.Namespace) -> tuple[Path, Config]:
    path = resolve_config_path(args.config)
    return path, load_config(path)


def _call(
    args: argparse.Namespace,
    method: str,
    params: dict[str, Any] | None = None,
    timeout: float | None = 30.0,
) -> Any:
    socket, error = socket_for(args.config)
    if error is not None:
        print(f"memd: warning: {error}", file=sys.stderr)
    with MemdClient(socket, timeout=timeout) as client:
        return client.call(method, params)


def cmd_run(args: argparse.Namespace) -> int:
    from memd.daemon import run_daemon
    from memd.logs import configure_logging
    from memd.rpc import SocketSetupError

    configure_logging(args.log_level)
    path, config = _config(args)
    try:
        return run_daemon(path, config)
    except SocketSetupError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def cmd_status(args: argparse.Namespace) -> int:
    status = _call(args, "daemon.status")
    if args.json:
        print(json.dumps(status, indent=2))
        return EXIT_OK
    print(
        f"memd {status['version']}  pid {status['pid']}  "
        f"up {_duration(status['uptime_seconds'])}  rss {status['rss_bytes'] // 2**20} MB"
    )
    print(
        f"config   {status['config_path']}"
        + ("" if status["config_loaded"] else "  (not found: defaults)")
    )
    if status.get("config_error"):
        print(f"         last edit rejected: {status['config_error']}")
    print(f"socket   {status['socket']}")
    print(f"memory   {status['memory_dir']}")
    if status.get("compaction"):
        print(f"compact  {_compaction_line(status['compaction'])}")
    rows = [_status_row(cid, c) for cid, c in status["clients"].items()]
    print()
    print(
        _table(["CLIENT", "MODE", "MEMORY", "WATCHER", "INDEX", "SESSION", "COMPACTION"], rows)
        if rows
        else "no clients configured"
    )
    return EXIT_OK


def _status_row(client_id: str, c: dict[str, Any]) -> list[str]:
    def child(name: str) -> str:
        proc = c.get(name) or {}
        if not proc:
            return "-"
        text = proc.get("state", "?")
        if proc.get("pid"):
            text += f" pid {proc['pid']}"
        if proc.get("restarts"):
            text += f" ({proc['restarts']} restarts)"
        return text

    session = (c.get("active_session") or {}).get("session_id", "-")
    return [
        client_id,
        c["mode"],
        _memory_word(c),
        child("watcher"),
        child("index_server"),
        session,
        _client_compaction(c.get("compaction") or {}),
    ]


def _compaction_line(comp: dict[str, Any]) -> str:
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


def _client_compaction(c: dict[str, Any]) -> str:
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


def _memory_word(c: dict[str, Any]) -> str:
    if c["memory_on"]:
        return "on"
    if c["mode"] not in ("mcp_via_llm", "both") and c.get("memory_enabled"):
        return "unsupported mode"
    return "off" if c.get("memory_enabled") is False else "off (unset)"


def cmd_clients(args: argparse.Namespace) -> int:
    if args.reset:
        reset = _call(args, "clients.reset", {"client_id": args.reset})["reset"]
        print(f"{args.reset}: restarting" if reset else f"{args.reset}: nothing was FATAL")
        return EXIT_OK
    result = _call(args, "clients.list")
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    rows = [[c["client_id"], c["mode"], _memory_word(c)] for c in result["clients"]]
    print(_table(["CLIENT", "MODE", "MEMORY"], rows) if rows else "no clients configured")
    return EXIT_OK


def cmd_record(args: argparse.Namespace) -> int:
    if args.chat:
        if any(
            v is not None for v in (args.conversation, args.user, args.assistant, args.exchange_id)
        ):
            raise UsageError(
                "use either --chat or --conversation/--user/--assistant "
                "(--exchange-id goes with the latter)"
            )
        body = _read_json(args.chat)
        if not isinstance(body, dict) or set(body) - {"messages", "response"}:
            raise UsageError("--chat needs a JSON object with 'messages' and 'response'")
        params = {"client_id": args.client, **body}
        method = "memory.record_chat"
    else:
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
        method = "memory.record_exchange"
    if args.timestamp:
        params["timestamp"] = args.timestamp
    result = _call(args, method, params)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        done = "already recorded" if result.get("duplicate") else "recorded"
        print(f"{done} in session {result['session_id']}, conversation {result['conversation']}")
    return EXIT_OK


def _read_json(source: str) -> Any:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        return json.loads(text)
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from exc


def cmd_sessions_list(args: argparse.Namespace) -> int:
    result = _call(args, "sessions.list", {"client_id": args.client})
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    rows = [
        [
            s["session_id"],
            s["state"],
            s["started"],
            s["last_activity"],
            str(s["conversations"]),
            s["path"],
        ]
        for s in result["sessions"]
    ]
    header = ["SESSION", "STATE", "STARTED", "LAST ACTIVITY", "CONVS", "PATH"]
    print(_table(header, rows) if rows else "no sessions yet")
    return EXIT_OK


def cmd_sessions_close(args: argparse.Namespace) -> int:
    result = _call(args, "sessions.close", {"client_id": args.client})
    if args.json:
        print(json.dumps(result, indent=2))
    elif result["closed"]:
        for session in result["sessions"]:
            print(f"ended session {session['session_id']}")
    else:
        print("no active session")
    return EXIT_OK


def cmd_sessions_recompact(args: argparse.Namespace) -> int:
    """One call per session, so a long run shows progress and no call hits a timeout."""
    if args.session:
        targets = [args.session]
    else:
        rows = _call(args, "sessions.list", {"client_id": args.client})["sessions"]
        targets = [r["session_id"] for r in rows if r["state"] in ("ended", "compacted")]
    results = []
    failed = 0
    for done, sid in enumerate(targets, 1):
        reply = _call(
            args, "sessions.recompact", {"client_id": args.client, "session_id": sid}, timeout=None
        )
        for item in reply["results"]:
            results.append(item)
            failed += item["result"] == "failed"
            if not args.json:
                error = f" ({item['error']})" if item.get("error") else ""
                print(
                    f"[{done}/{len(targets)}] {item['session_id']}: {item['result']}{error}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    elif not targets:
        print("no ended or compacted sessions")
    return EXIT_ERROR if failed else EXIT_OK


def _folder(args: argparse.Namespace) -> Path:
    from memd.layout import ClientLayout, LayoutError

    _, config = _config(args)
    if not args.client:
        return config.memory_dir
    try:
        return ClientLayout(config.memory_dir, args.client).root
    except LayoutError as exc:
        raise ConfigError(str(exc)) from exc


def cmd_path(args: argparse.Namespace) -> int:
    print(_folder(args))
    return EXIT_OK


def cmd_open(args: argparse.Namespace) -> int:
    folder = _folder(args)
    if not folder.exists():
        print(f"memd: {folder} does not exist yet (no memory recorded)", file=sys.stderr)
        return EXIT_ERROR
    opener = "open" if sys.platform == "darwin" else "xdg-open"
    if shutil.which(opener) is None:
        print(f"memd: no {opener} on this system; the folder is {folder}", file=sys.stderr)
        return EXIT_ERROR
    subprocess.run([opener, str(folder)], check=False)
    return EXIT_OK


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


if __name__ == "__main__":
    sys.exit(main())
