"""`memd ui`: a login link to the memory browser of the running memd, opened or printed."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import webbrowser
from typing import Any

from memd.config import load_config, socket_for

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 2, 3


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `memd ui` on the memd command's subparsers."""
    ui = sub.add_parser(
        "ui",
        parents=[common],
        help="open the memory browser (a login link for the running memd)",
        description="Print a single-use login link to the memory browser that `memd run` "
        "serves on loopback ([ui] in the config), and open it in the desktop "
        "browser where there is one. The link works once, within 10 minutes.",
    )
    ui.add_argument("--print", action="store_true", help="only print the link")
    ui.set_defaults(func=cmd_ui)


def services() -> list[Any]:
    """What `memd run` runs beside its socket: the browser (idle when [ui] is off)."""
    from memd.ui.hook import UiService

    return [UiService()]


def status_line(ui: dict[str, Any]) -> str:
    """The `ui` line of `memd status`."""
    if ui["state"] != "running":
        return f"{ui['state']}: {ui.get('error', '')}"
    return f"{ui['url']}  (`memd ui` opens it)"


def cmd_ui(args: argparse.Namespace) -> int:
    from memd.proxy.rpc import MemdUnavailable
    from memd.ui.tokens import LoginTokens, TokenError

    config = load_config(args.config)
    if not config.ui.enabled:
        print("memd: the memory browser is off: set enabled = true in [ui]", file=sys.stderr)
        return EXIT_USAGE
    try:
        ui = asyncio.run(_ui_status(socket_for(args.config)[0]))
    except MemdUnavailable as exc:
        print(f"memd: {exc}; start it with `memd run`", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not ui or ui.get("state") != "running":
        why = (ui or {}).get("error") or "not started"
        print(f"memd: the memory browser is not running ({why})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        token = LoginTokens(config.memory_dir).issue()
    except TokenError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    link = f"{ui['url']}login?token={token}"
    print(link)
    if not args.print and _has_desktop():
        webbrowser.open(link)
    return EXIT_OK


async def _ui_status(socket: Any) -> dict[str, Any] | None:
    from memd.proxy.rpc import AsyncMemdClient

    client = AsyncMemdClient(socket, timeout=15.0)
    try:
        status = await client.call("daemon.status")
    finally:
        await client.close()
    ui: dict[str, Any] | None = status.get("ui")
    return ui


def _has_desktop() -> bool:
    """A graphical browser can open: macOS, or a display on other systems (never a
    terminal browser that would take over this terminal)."""
    if sys.platform == "darwin":
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
