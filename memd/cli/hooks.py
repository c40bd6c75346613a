"""`memd hooks install|uninstall|run claude-code`: Claude Code's turns recorded without a proxy.

`install` merges two command hooks into Claude Code's settings (`~/.claude/settings.json`
with `--scope user`, `.claude/settings.json` of the current folder with `--scope
project`): `Stop` (Claude finished answering: the turn is complete) and `SessionEnd`.
Each runs `python -m memd.cli.hook_run --client ID` (what `memd hooks run claude-code`
does, without loading the whole CLI: 0.8 s to start instead of 2.5-3.4 s), which records
every turn of the session's transcript not recorded yet. `uninstall` removes only
memd's entries.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memd.cli import hook_run, hook_settings

DEFAULT_CLIENT = "claude-code"


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `hooks` (install, uninstall, run) to the `memd` subcommands."""
    hooks = sub.add_parser(
        "hooks",
        parents=[common],
        help="record Claude Code's turns through its hooks (no proxy needed)",
        description="Add memd to Claude Code's hooks (Stop and SessionEnd) so that each "
        "turn is recorded from the session's transcript file.",
    )
    verbs = hooks.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, text in (
        ("install", "merge memd's hooks into Claude Code's settings"),
        ("uninstall", "remove memd's hooks (and only them) from Claude Code's settings"),
        ("run", "what the hook command does, by hand (reads the hook's JSON on stdin)"),
    ):
        p = verbs.add_parser(verb, parents=[common], help=text, description=text)
        p.add_argument("app", choices=["claude-code"], help="the app whose hooks to change")
        if verb != "uninstall":
            p.add_argument("--client", default=DEFAULT_CLIENT, help="memd client id to record into")
        if verb != "run":
            p.add_argument("--scope", choices=["user", "project"], default="user")
        p.set_defaults(func={"install": cmd_install, "uninstall": cmd_uninstall}.get(verb, cmd_run))


def cmd_install(args: argparse.Namespace) -> int:
    path = hook_settings.settings_path(args.scope)
    command = hook_settings.hook_command(args.client, args.config)
    try:
        changed = hook_settings.install(path, command)
    except hook_settings.SettingsError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return 2
    print(f"{'added memd to' if changed else 'memd is already in'} {path}: {command}")
    print(f"each Claude Code turn is recorded into client {args.client!r} (memory on for it)")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    path = hook_settings.settings_path(args.scope)
    try:
        removed = hook_settings.uninstall(path)
    except hook_settings.SettingsError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return 2
    print(f"removed {removed} memd hook(s) from {path}" if removed else f"no memd hook in {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """`memd hooks run claude-code`: the same as the hook command (memd.cli.hook_run)."""
    return hook_run.run(args.client, args.config)
