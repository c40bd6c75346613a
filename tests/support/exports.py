"""ChatGPT and Claude.ai data exports in their published shapes, built by the tests.

ChatGPT: `conversations.json` is an array of conversations, each with `title`,
`create_time`/`update_time` (epoch seconds), `mapping` (node id -> {id, message, parent,
children}), `current_node`, `conversation_id`/`id`; a message has `id`, `author.role`,
`create_time`, `content` ({content_type, parts}), `metadata`, `recipient`.
Claude.ai: an array of {uuid, name, created_at, updated_at, account, chat_messages}, each
message {uuid, sender: human|assistant, created_at, text, content: [blocks], attachments,
files}.
"""

from __future__ import annotations

import json
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC).timestamp()


@dataclass
class ChatGPTConversation:
    """Builds one conversation's `mapping`; `say` appends below a parent (a branch if the
    parent already has a child), and `current_node` is the last node said unless set."""

    title: str
    created: str
    cid: str = field(default_factory=lambda: str(uuid.uuid4()))
    mapping: dict[str, Any] = field(default_factory=dict)
    current: str | None = None

    def __post_init__(self) -> None:
        root = "client-created-root"
        self.mapping[root] = {"id": root, "message": None, "parent": None, "children": []}
        self.current = root

    def say(
        self,
        role: str,
        parts: list[Any] | None = None,
        when: str | None = None,
        *,
        parent: str | None = None,
        content_type: str = "text",
        recipient: str = "all",
        hidden: bool = False,
        attachments: list[str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        nid = str(uuid.uuid4())
        parent = parent or self.current
        assert parent is not None
        metadata: dict[str, Any] = {}
        if hidden:
            metadata["is_visually_hidden_from_conversation"] = True
        if attachments:
            metadata["attachments"] = [{"id": f"file-{n}", "name": n} for n in attachments]
        content: dict[str, Any] = {"content_type": content_type, **(extra or {})}
        if parts is not None:
            content["parts"] = parts
        message = {
            "id": nid,
            "author": {"role": role, "name": None, "metadata": {}},
            "create_time": epoch(when) if when else None,
            "update_time": None,
            "content": content,
            "status": "finished_successfully",
            "end_turn": True if role == "assistant" else None,
            "weight": 1.0,
            "metadata": metadata,
            "recipient": recipient,
        }
        self.mapping[nid] = {"id": nid, "message": message, "parent": parent, "children": []}
        self.mapping[parent]["children"].append(nid)
        self.current = nid
        return nid

    def export(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "create_time": epoch(self.created),
            "update_time": epoch(self.created) + 3600,
            "mapping": self.mapping,
            "moderation_results": [],
            "current_node": self.current,
            "plugin_ids": None,
            "conversation_id": self.cid,
            "conversation_template_id": None,
            "gizmo_id": None,
            "is_archived": False,
            "safe_urls": [],
            "default_model_slug": "gpt-4o",
            "id": self.cid,
        }


def claude_message(
    sender: str,
    text: str,
    when: str,
    *,
    content: list[dict[str, Any]] | None = None,
    attachments: list[dict[str, Any]] | None = None,
    files: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    blocks = content if content is not None else [{"type": "text", "text": text}]
    return {
        "uuid": str(uuid.uuid4()),
        "text": text,
        "content": [{"start_timestamp": when, "stop_timestamp": when, **b} for b in blocks],
        "sender": sender,
        "created_at": when,
        "updated_at": when,
        "attachments": attachments or [],
        "files": files or [],
    }


def claude_conversation(name: str, created: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uuid": str(uuid.uuid4()),
        "name": name,
        "created_at": created,
        "updated_at": created,
        "account": {"uuid": "acc-0000"},
        "chat_messages": messages,
    }


def write_json(path: Path, conversations: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(conversations, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def write_zip(path: Path, conversations: list[dict[str, Any]], member: str) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, json.dumps(conversations, ensure_ascii=False))
        z.writestr("users.json", json.dumps({"id": "user-1"}))
    return path
