"""Claude.ai's data export (`conversations.json`): one conversation to memd exchanges.

Each conversation (`uuid`, `name`, `created_at`) holds its `chat_messages` in order,
each with `uuid`, `sender` (`human` or `assistant`), `created_at`, `text` and `content`
blocks (`text`, `tool_use`, `tool_result`, `thinking`). memd keeps the text blocks (or
`text` when there are none), notes each tool call as `[tool: name]`, leaves tool results
and thinking out, and turns `attachments` and `files` into `[attachment: name]` and
`[file: name]` lines.
"""

from __future__ import annotations

from typing import Any

from memd.histories.model import EPOCH, Conversation, Tally, from_iso


def conversation(raw: Any, n: int, tally: Tally) -> Conversation | None:
    """The conversation at position `n` of the file, or None (counted) if it has no exchange."""
    if not isinstance(raw, dict) or not isinstance(raw.get("chat_messages"), list):
        raise ValueError(f"conversation {n}: no `chat_messages` list")
    cid = raw.get("uuid")
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"conversation {n}: no `uuid`")
    when = from_iso(raw.get("created_at"), EPOCH)
    title = raw.get("name") if isinstance(raw.get("name"), str) else ""
    conv = Conversation(f"claude:{cid}", title or "", when)
    for i, msg in enumerate(raw["chat_messages"]):
        if not isinstance(msg, dict):
            raise ValueError(f"conversation {n} ({cid}): message {i} is not an object")
        text = _text(msg, tally)
        if text is None:
            continue
        mid = str(msg.get("uuid") or f"{cid}#{i}")
        msg_when = from_iso(msg.get("created_at"), when)
        conv.add(msg.get("sender") == "human", text, mid, msg_when)
    if not conv.exchanges:
        tally.skip("conversation(s) with no messages")
        return None
    return conv


def _text(msg: dict[str, Any], tally: Tally) -> str | None:
    sender = msg.get("sender")
    if sender not in ("human", "assistant"):
        tally.skip(f"{sender} message(s)")
        return None
    blocks = [b for b in msg.get("content") or [] if isinstance(b, dict)]
    lines: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            lines.append(block["text"])
        elif kind == "tool_use":
            lines.append(f"[tool: {block.get('name', 'tool')}]")
        else:
            tally.skip(f"{kind} block(s)")
    if not any(b.get("type") == "text" for b in blocks) and isinstance(msg.get("text"), str):
        lines.insert(0, msg["text"])
    lines += [f"[attachment: {a.get('file_name', 'file')}]" for a in _dicts(msg, "attachments")]
    lines += [f"[file: {f.get('file_name', 'file')}]" for f in _dicts(msg, "files")]
    text = "\n\n".join(line for line in lines if line.strip())
    if not text:
        tally.skip("empty message(s)")
        return None
    return text


def _dicts(msg: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = msg.get(key)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
