"""Claude Code's transcript JSON lines and hook payloads, in their documented shapes.

A transcript line: {parentUuid, isSidechain, userType, cwd, sessionId, version, gitBranch,
type: "user"|"assistant"|"summary"|"file-history-snapshot", message: {role, content},
uuid, timestamp}; assistant messages carry Anthropic content blocks (`text`, `thinking`,
`tool_use`), user messages a string or blocks (`text`, `image`, `tool_result`). A hook's
stdin: {session_id, transcript_path, cwd, permission_mode, hook_event_name, ...}.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any


class Transcript:
    """Appends entries to a transcript file as Claude Code does, one JSON object a line."""

    def __init__(self, path: Path, session_id: str | None = None) -> None:
        self.path = path
        self.session_id = session_id or str(uuid.uuid4())
        self.parent: str | None = None

    def add(self, kind: str, content: Any, when: str, **extra: Any) -> str:
        uid = str(uuid.uuid4())
        role = "user" if kind == "user" else "assistant"
        message: dict[str, Any] = {"role": role, "content": content}
        if kind == "assistant":
            message |= {"model": "claude-sonnet-4-5", "id": f"msg_{uid[:8]}", "type": "message"}
        entry = {
            "parentUuid": self.parent,
            "isSidechain": False,
            "userType": "external",
            "cwd": "/home/u/project",
            "sessionId": self.session_id,
            "version": "2.0.30",
            "gitBranch": "main",
            "type": kind,
            "message": message,
            "uuid": uid,
            "timestamp": when,
            **extra,
        }
        self.write(entry)
        self.parent = uid
        return uid

    def write(self, entry: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def payload(self, event: str = "Stop") -> dict[str, Any]:
        data: dict[str, Any] = {
            "session_id": self.session_id,
            "transcript_path": str(self.path),
            "cwd": "/home/u/project",
            "permission_mode": "default",
            "hook_event_name": event,
        }
        if event == "Stop":
            data["stop_hook_active"] = False
        else:
            data["reason"] = "prompt_input_exit"
        return data
