"""The Claude Code hook command: record the turns of a session's transcript not recorded yet.

Run by Claude Code as `python -m memd.cli.hook_run --client ID [--config PATH]` on its
`Stop` and `SessionEnd` hooks (memd.cli.hooks installs them), with the hook's JSON on
stdin; of it only `transcript_path` is read. The transcript is read with
memd.histories.claude_code and each complete turn goes to `memory.record_exchange` with
its user entry's `uuid` as exchange id, so a hook that fires twice or a resumed session
writes nothing twice. It never fails or holds up the user's session: it always exits 0,
gives up on memd after CONNECT_TIMEOUT, and a turn it could not record is recorded by
the next hook. A small cursor file per transcript remembers the last turn recorded, so
a hook reads the file but does not resend the whole session. Only light modules are
imported here: `memd hooks run` through memd.cli.main took 2.5-3.4 s to start on a
loaded 2-core machine, this module 0.8-0.9 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from memd.cli.client import ClientError, MemdClient, RemoteError
from memd.config import socket_for
from memd.histories.claude_code import Turn, conversation_id, stamp, turns

CONNECT_TIMEOUT = 3.0  # seconds for memd to answer one call before the hook gives up
BUDGET = 20.0  # seconds of recording per hook run; the rest waits for the next turn
MAX_PAYLOAD = 1 << 20


def run(client: str, config: str | None) -> int:
    """Record what the transcript holds and memd lacks; always 0 (see the module doc)."""
    try:
        note = _run(client, config)
    except Exception as exc:  # never fail the user's session
        note = f"not recorded ({type(exc).__name__}: {exc}); the next turn retries"
    if note:
        print(f"memd: {note}", file=sys.stderr)
    return 0


def _run(client_id: str, config: str | None) -> str:
    payload = json.loads(sys.stdin.buffer.read(MAX_PAYLOAD) or b"{}")
    path = payload.get("transcript_path") if isinstance(payload, dict) else None
    if not isinstance(path, str) or not Path(path).is_file():
        return "no transcript_path in the hook's input; nothing recorded"
    cursor = _cursor(client_id, path)
    todo = _pending(list(turns(Path(path))), cursor.read())
    if not todo:
        return ""
    socket, _ = socket_for(config)
    done = 0
    deadline = time.monotonic() + BUDGET
    try:
        with MemdClient(socket, timeout=CONNECT_TIMEOUT) as client:
            for conv, turn in todo:
                if time.monotonic() > deadline:
                    break
                ex = turn.exchange
                params = {"client_id": client_id, "conversation_id": conv, "user": ex.user}
                params |= {"assistant": ex.assistant, "timestamp": stamp(ex.when)}
                try:
                    client.call("memory.record_exchange", {**params, "exchange_id": ex.exchange_id})
                except RemoteError as exc:
                    # Recorded before with other text (a turn read while still being
                    # written): what memd has stays, and the turns after it go on.
                    if exc.kind != "exchange_conflict":
                        raise
                done += 1
    except (ClientError, RemoteError, OSError) as exc:
        return f"{done} of {len(todo)} turn(s) recorded ({exc}); the next turn retries"
    finally:
        if done:
            cursor.write(todo[done - 1][1].exchange.exchange_id)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memd.cli.hook_run", description=__doc__)
    parser.add_argument("--client", default="claude-code")
    parser.add_argument("--config", help="memd's config (default: as `memd` finds it)")
    args, _ = parser.parse_known_args(argv)
    return run(args.client, args.config)


if __name__ == "__main__":
    sys.exit(main())
