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
from memd.client import ClientError, MemdClient, RemoteError
from memd.config import Config, ConfigError, load_config, resolve_config_path, socket_for

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH",
                        help="config file (default: $MEMD_CONFIG, else ~/.config/memd/config.toml)")
    parser = argparse.ArgumentParser(
        prog="memd", parents=[common],
        description="Persistent conversation memory for LLM clients.")
    parser.add_argument("--version", action="version", version=f"memd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", parents=[common], help="run the daemon in the foreground")
    run.add_argument("--log-level", default="info",
                     choices=["debug", "info", "warning", "error"])
    run.set_defaults(func=cmd_run)

    status = sub.add_parser("status", parents=[common], help="show the daemon and its clients")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.set_defaults(func=cmd_status)

    clients = sub.add_parser("clients", parents=[common],
                             help="list configured clients and whether memory is on")
    clients.add_argument("--json", action="store_true", help="print the raw JSON")
    clients.set_defaults(func=cmd_clients)

    path = sub.add_parser("path", parents=[common],
                          help="print the memory folder (or one client's)")
    path.add_argument("client", nargs="?", help="a client id")
    path.set_defaults(func=cmd_path)

    opener = sub.add_parser("open", parents=[common],
                            help="open the memory folder in the desktop file manager")
    opener.add_argument("client", nargs="?", help="a client id")
    opener.set_defaults(func=cmd_open)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ConfigError as exc:
        print(f"memd: config error: {exc}", file=sys.stderr)
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


def _call(args: argparse.Namespace, method: str, params: dict[str, Any] | None = None) -> Any:
    socket, error = socket_for(args.config)
    if error is not None:
        print(f"memd: warning: {error}", file=sys.stderr)
    with MemdClient(socket) as client:
        return client.call(method, params)


def cmd_run(args: argparse.Namespace) -> int:
    from memd.daemon import run_daemon
    from memd.logs import configure_logging
    from memd.rpcserver import SocketSetupError

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
    print(f"memd {status['version']}  pid {status['pid']}  "
          f"up {_duration(status['uptime_seconds'])}")
    print(f"config   {status['config_path']}"
          + ("" if status["config_loaded"] else "  (not found: defaults)"))
    if status.get("config_error"):
        print(f"         last edit rejected: {status['config_error']}")
    print(f"socket   {status['socket']}")
    print(f"memory   {status['memory_dir']}")
    rows = [_status_row(cid, c) for cid, c in status["clients"].items()]
    print()
    print(_table(["CLIENT", "MODE", "MEMORY", "WATCHER", "INDEX", "SESSION"], rows)
          if rows else "no clients configured")
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
    return [client_id, c["mode"], _memory_word(c), child("watcher"), child("index_server"),
            session]


def _memory_word(c: dict[str, Any]) -> str:
    if c["memory_on"]:
        return "on"
    if c["mode"] not in ("mcp_via_llm", "both") and c.get("memory_enabled"):
        return "unsupported mode"
    return "off" if c.get("memory_enabled") is False else "off (unset)"


def cmd_clients(args: argparse.Namespace) -> int:
    result = _call(args, "clients.list")
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    rows = [[c["client_id"], c["mode"], _memory_word(c)] for c in result["clients"]]
    print(_table(["CLIENT", "MODE", "MEMORY"], rows) if rows else "no clients configured")
    return EXIT_OK


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
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]
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
