"""ChatGPT's data export (`conversations.json`): one conversation's tree to memd exchanges.

Each conversation holds a `mapping` of nodes (`id`, `message`, `parent`, `children`):
every edit and regeneration is a branch. memd keeps the branch the user last saw, from
`current_node` up to the root. Of its messages only what the user saw is kept: `user`
and `assistant` messages addressed to everyone (`recipient` "all") with `text` or
`multimodal_text` content; system prompts, tool calls and outputs (`recipient` a tool,
role `tool`), hidden context (`metadata.is_visually_hidden_from_conversation`, e.g.
custom instructions) and reasoning are left out and counted. Images, audio and other
non-text parts become a placeholder line such as `[image]`, and attachments named in
`metadata.attachments` `[attachment: name]`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from memd.histories.model import EPOCH, Conversation, Tally, from_epoch

SHOWN = ("text", "multimodal_text")


def conversation(raw: Any, n: int, tally: Tally) -> Conversation | None:
    """The conversation at position `n` of the file, or None (counted) if it has no exchange."""
    if not isinstance(raw, dict) or not isinstance(raw.get("mapping"), dict):
        raise ValueError(f"conversation {n}: no `mapping` of messages")
    cid = raw.get("conversation_id") or raw.get("id")
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"conversation {n}: no `id`")
    when = from_epoch(raw.get("create_time"), EPOCH)
    title = raw.get("title") if isinstance(raw.get("title"), str) else ""
    branch = list(_branch(raw["mapping"], raw.get("current_node")))
    tally.skip("message(s) on other branches", _messages(raw["mapping"]) - len(branch))
    conv = Conversation(f"chatgpt:{cid}", title or "", when)
    for msg in branch:
        text = _shown(msg, tally)
        if text is None:
            continue
        mid = str(msg.get("id") or f"{cid}#{len(conv.exchanges)}")
        msg_when = from_epoch(msg.get("create_time"), when)
        conv.add(msg["author"]["role"] == "user", text, mid, msg_when)
    if not conv.exchanges:
        tally.skip("conversation(s) with no messages")
        return None
    return conv


def _messages(mapping: dict[str, Any]) -> int:
    return sum(1 for node in mapping.values() if isinstance(node, dict) and node.get("message"))


def _branch(mapping: dict[str, Any], current: Any) -> Iterator[dict[str, Any]]:
    """The messages from the root down to `current_node` (the last leaf if it is missing)."""
    if current not in mapping:
        leaves = [k for k, v in mapping.items() if isinstance(v, dict) and not v.get("children")]
        current = leaves[-1] if leaves else None
    path: list[dict[str, Any]] = []
    seen: set[str] = set()
    while isinstance(current, str) and current in mapping and current not in seen:
        seen.add(current)
        node = mapping[current]
        if not isinstance(node, dict):
            break
        if isinstance(node.get("message"), dict):
            path.append(node["message"])
        current = node.get("parent")
    return reversed(path)


def _shown(msg: dict[str, Any], tally: Tally) -> str | None:
    """The text the user saw of one message, or None (counted) if it is left out."""
    role = (msg.get("author") or {}).get("role")
    meta = msg.get("metadata") or {}
    content = msg.get("content") or {}
    if role == "system":
        tally.skip("system message(s)")
    elif role == "tool" or msg.get("recipient") not in (None, "all"):
        tally.skip("tool call(s) and output(s)")
    elif role not in ("user", "assistant"):
        tally.skip(f"{role} message(s)")
    elif meta.get("is_visually_hidden_from_conversation"):
        tally.skip("hidden message(s)")
    elif content.get("content_type") not in SHOWN:
        tally.skip(f"{content.get('content_type')} part(s)")
    else:
        lines = [_part(p) for p in content.get("parts") or []]
        lines += [f"[attachment: {a.get('name', 'file')}]" for a in meta.get("attachments") or []]
        text = "\n\n".join(line for line in lines if line.strip())
        if text:
            return text
        tally.skip("empty message(s)")
    return None


def _part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        kind = str(part.get("content_type", "part"))
        if isinstance(part.get("text"), str):  # audio_transcription
            return str(part["text"])
        return "[image]" if "image" in kind else f"[{kind.removesuffix('_asset_pointer')}]"
    return ""
