"""`memd hooks install|uninstall|run claude-code`: Claude Code's turns recorded without a proxy.

`install` merges two command hooks into Claude Code's settings (`~/.claude/settings.json`
with `--scope user`, `.claude/settings.json` of the current folder with `--scope
project`): `Stop` (Claude finished answering: the turn is complete) and `SessionEnd`.
Each runs `memd hooks run claude-code --client ID`, which reads the hook's JSON on
stdin (`transcript_path`, `session_id`, `hook_event_name`), reads the transcript file
(memd.histories.claude_code) and records every turn not recorded yet through
`memory.record_exchange`, each with its user entry's `uuid` as exchange id: a hook that
fires twice or a resumed session writes nothing twice. The hook never fails or holds up
the user's session: it always exits 0, gives up on memd after CONNECT_TIMEOUT, and a
turn it could not record is recorded by the next hook (a small cursor file per
transcript remembers the last turn recorded, so a hook reads but does not resend the
whole session). `uninstall` removes only memd's entries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from memd.cli import hook_settings
from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.config import socket_for
from memd.histories.claude_code import Turn, conversation_id, stamp, turns

CONNECT_TIMEOUT = 3.0  # seconds for memd to answer one call before the hook gives up
BUDGET = 20.0  # seconds of recording per hook run; the rest waits for the next turn
MAX_PAYLOAD = 1 << 20
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
        ("run", "the hook command Claude Code runs (reads the hook's JSON on stdin)"),
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
    """Record what the transcript holds and memd lacks; always 0 (see the module doc)."""
    try:
        note = _run(args)
    except Exception as exc:  # never fail the user's session
        note = f"not recorded ({type(exc).__name__}: {exc}); the next turn retries"
    if note:
        print(f"memd: {note}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> str:
    payload = json.loads(sys.stdin.buffer.read(MAX_PAYLOAD) or b"{}")
    path = payload.get("transcript_path") if isinstance(payload, dict) else None
    if not isinstance(path, str) or not Path(path).is_file():
        return "no transcript_path in the hook's input; nothing recorded"
    todo = _pending(list(turns(Path(path))), _cursor(args.client, path).read())
    if not todo:
        return ""
    socket, _ = socket_for(args.config)
    done = 0
    deadline = time.monotonic() + BUDGET
    try:
        with MemdClient(socket, timeout=CONNECT_TIMEOUT) as client:
            for conv, turn in todo:
                if time.monotonic() > deadline:
                    break
                ex = turn.exchange
                client.call(
                    "memory.record_exchange",
                    {
                        "client_id": args.client,
                        "conversation_id": conv,
                        "user": ex.user,
                        "assistant": ex.assistant,
                        "timestamp": stamp(ex.when),
                        "exchange_id": ex.exchange_id,
                    },
                )
                done += 1
    except (ClientError, RemoteError, OSError) as exc:
        return f"{done} of {len(todo)} turn(s) recorded ({exc}); the next turn retries"
    finally:
        if done:
            _cursor(args.client, path).write(todo[done - 1][1].exchange.exchange_id)
    return ""


def _pending(all_turns: list[Turn], last: str | None) -> list[tuple[str, Turn]]:
    """Complete turns after the one recorded last (all of them if it is not found): a
    turn is complete once answered or followed by another."""
    if not all_turns:
        return []
    conv = conversation_id(all_turns[0].exchange)
    complete = [t for i, t in enumerate(all_turns) if t.answered or i + 1 < len(all_turns)]
    ids = [t.exchange.exchange_id for t in complete]
    start = ids.index(last) + 1 if last in ids else 0
    return [(conv, t) for t in complete[start:]]


class _Cursor:
    """The last turn recorded from one transcript, in memd's state folder (a hint only:
    memd's exchange ids are what keeps turns from being written twice)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> str | None:
        try:
            value = json.loads(self.path.read_text(encoding="utf-8")).get("last")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) else None

    def write(self, last: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"last": last}), encoding="utf-8")
        os.replace(tmp, self.path)


def _cursor(client: str, transcript: str) -> _Cursor:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    name = hashlib.blake2b(f"{client}\0{transcript}".encode(), digest_size=16).hexdigest()
    return _Cursor(base / "memd" / "claude-code" / f"{name}.json")
