"""`memd path` and `memd open`: where memories (and the socket) are, to review or delete."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from memd.cli.common import EXIT_ERROR, EXIT_OK, UsageError, load, socket_origin
from memd.layout import ClientLayout, LayoutError


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `path` and `open` to the `memd` subcommands."""
    path = sub.add_parser(
        "path",
        parents=[common],
        help="print the memory folder (or one client's, or the socket)",
        description="Print the memory folder, one client's folder, or with --socket the "
        "socket the CLI connects to (e.g. socat - UNIX-CONNECT:$(memd path --socket)).",
    )
    path.add_argument("client", nargs="?", help="a client id")
    path.add_argument(
        "--socket", action="store_true", help="print the daemon's socket path instead"
    )
    path.set_defaults(func=cmd_path)

    opener = sub.add_parser(
        "open", parents=[common], help="open the memory folder in the desktop file manager"
    )
    opener.add_argument("client", nargs="?", help="a client id")
    opener.set_defaults(func=cmd_open)


def folder(args: argparse.Namespace) -> Path:
    """The memory folder, or the named client's: configured, or with memories on disk."""
    config_path, config = load(args)
    if not args.client:
        return config.memory_dir
    try:
        root = ClientLayout(config.memory_dir, args.client).root
    except LayoutError as exc:
        raise UsageError(f"{args.client!r} is not a valid client id: {exc}") from exc
    if args.client not in config.clients and not root.exists():
        where = config_path if config.source else f"the defaults (no file at {config_path})"
        names = ", ".join(sorted(config.clients)) or "none"
        raise UsageError(
            f"no client {args.client!r} in {where} (configured: {names}) and no folder at {root}"
        )
    if args.client not in config.clients:
        print(
            f"memd: note: {args.client!r} is not in the config; its folder remains", file=sys.stderr
        )
    return root


def cmd_path(args: argparse.Namespace) -> int:
    if args.socket:
        if args.client:
            raise UsageError("--socket takes no client: memd has one socket for all")
        print(socket_origin(args.config)[0])
        return EXIT_OK
    print(folder(args))
    return EXIT_OK


def cmd_open(args: argparse.Namespace) -> int:
    target = folder(args)
    if not target.exists():
        print(f"memd: {target} does not exist yet (no memory recorded)", file=sys.stderr)
        return EXIT_ERROR
    opener = "open" if sys.platform == "darwin" else "xdg-open"
    if shutil.which(opener) is None:
        print(f"memd: no {opener} on this system; the folder is {target}", file=sys.stderr)
        return EXIT_ERROR
    subprocess.run([opener, str(target)], check=False)
    return EXIT_OK
