"""The `memd` command: a registry of command modules, each adding its own parsers.

A command lives in a module of `memd.cli` with `add_parsers(sub, common)`, which adds its
subparsers and sets `func` (the entry point, `args -> exit code`). To add a command, add
its module to `COMMANDS`. `main` turns the errors every command may raise into one line
on stderr and the documented exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from memd import __version__
from memd.cli import folders, init, privacy, recall, record, redact, service, sessions, status
from memd.cli import hooks as hooks_cli
from memd.cli import imports as imports_cli
from memd.cli.client import ClientError, RemoteError
from memd.cli.common import (  # re-exported: command modules written against main use them
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    call,
    check_config_exists,
    load,
    not_running_help,
    table,
)
from memd.config import ConfigError
from memd.proxy import cli as proxy_cli
from memd.ui import cli as ui_cli

__all__ = [
    "COMMANDS",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "call",
    "load",
    "main",
    "table",
]

# In the order `memd --help` lists them.
COMMANDS: tuple[ModuleType, ...] = (init, status, record, sessions, recall, privacy)
COMMANDS += (redact, imports_cli, hooks_cli, folders, service, proxy_cli, ui_cli)

EPILOG = """\
examples:
  memd init --client demo             write ~/.config/memd/config.toml with one client
  memd run                            run the daemon in the foreground
  memd service install                run it as a user service instead (systemd/launchd)
  memd status                         the daemon, its clients and what needs attention
  memd recall demo "spare key"        search memory as the client's LLM would
  memd mcp --print-config             the MCP server entry for Claude Desktop and others
  socat - UNIX-CONNECT:"$(memd path --socket)"   talk JSON-RPC to the daemon

exit codes:
  0 ok   1 the daemon answered an error   2 bad config or usage
  3 the daemon is not running (for `run`: another memd owns the socket)

logs:
  `memd run` logs to stderr; as a service: journalctl --user -u memd (systemd) or
  ~/Library/Logs/memd/memd.log (launchd). Each client's watcher and index server log
  to <memory_dir>/<client>/.memd/logs/ (see `memd path CLIENT`).

config: --config PATH, else $MEMD_CONFIG, else ~/.config/memd/config.toml
"""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $MEMD_CONFIG, else ~/.config/memd/config.toml)",
    )
    parser = argparse.ArgumentParser(
        prog="memd",
        parents=[common],
        description="Persistent conversation memory for LLM clients.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = _dispatch(func, args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # `memd … | head`: the reader has all it wanted. Point stdout at /dev/null so the
        # interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _dispatch(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        if getattr(args, "needs_config", True):
            check_config_exists(args.config)
        return func(args)
    except ConfigError as exc:
        print(f"memd: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:
        text = not_running_help(args.config, str(exc)) if exc.unreachable else str(exc)
        print(f"memd: {text}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except RemoteError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
