"""Claude Code's session transcript (JSON lines) read as memd exchanges, one per turn.

Claude Code appends one JSON object per line to the file its hook payload names as
`transcript_path`. memd reads entries whose `type` is `user` or `assistant` and uses
`uuid`, `timestamp`, `isSidechain`, `isMeta` and `message.content` (a string, or blocks
of `text`, `image`, `tool_use`, `tool_result`, `thinking`). A turn opens with a user
entry that carries the user's own text (not only `tool_result` blocks) and takes every
assistant entry up to the next such user entry: their `text` blocks are the answer,
each `tool_use` becomes a line `Tool call (name): {input}` (cut to TOOL_INPUT_CHARS, as
a transcript shows a tool call), `thinking` and tool results are left out. Sidechains
(subagents) and meta entries (command caveats) are skipped; lines that are not JSON (a
line still being written) end the read there.

The turn's exchange id is its user entry's `uuid`, and the conversation is named by the
first turn's `uuid`, so a hook that fires twice, or a resumed session whose file carries
the same entries, names every turn the same way and memd writes it once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memd.histories.model import EPOCH, Exchange, from_iso

TOOL_INPUT_CHARS = 300


@dataclass
class Turn:
    exchange: Exchange
    answered: bool  # an assistant entry followed the prompt


def turns(path: Path) -> Iterator[Turn]:
    """Every turn of the transcript at `path`, in order (see the module doc)."""
    current: Turn | None = None
    with path.open("rb") as f:
        for raw in f:
            try:
                entry = json.loads(raw)
            except ValueError:
                break  # a partial last line: it is read again on the next turn
            if not isinstance(entry, dict) or entry.get("isSidechain") or entry.get("isMeta"):
                continue
            kind = entry.get("type")
            content = (entry.get("message") or {}).get("content")
            if kind == "user":
                prompt = _prompt(content)
                if prompt is None:
                    continue
                if current is not None:
                    yield current
                when = from_iso(entry.get("timestamp"), EPOCH)
                current = Turn(Exchange(str(entry.get("uuid")), when, prompt, ""), False)
            elif kind == "assistant" and current is not None:
                _answer(current, content)
    if current is not None:
        yield current


def _prompt(content: Any) -> str | None:
    """The user's own text of a user entry; None for tool results (the agent's loop)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    lines: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            lines.append(block["text"])
        elif block.get("type") in ("image", "document"):
            lines.append(f"[{block['type']}]")
    return "\n\n".join(lines) if lines else None


def _answer(turn: Turn, content: Any) -> None:
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict):
            continue
        line = None
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            line = block["text"]
        elif block.get("type") == "tool_use":
            args = json.dumps(block.get("input"), ensure_ascii=False)
            if len(args) > TOOL_INPUT_CHARS:
                args = args[:TOOL_INPUT_CHARS] + "…"
            line = f"Tool call ({block.get('name', 'tool')}): {args}"
        if line and line.strip():
            ex = turn.exchange
            ex.assistant = f"{ex.assistant}\n\n{line}" if ex.assistant else line
            turn.answered = True


def conversation_id(first: Exchange) -> str:
    return f"claude-code:{first.exchange_id}"


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
