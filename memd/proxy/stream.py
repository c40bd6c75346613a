"""Server-sent events of a streamed chat completion: split, parse, and assemble the reply.

OpenAI-compatible servers stream `data: {chunk}` events separated by blank lines and end
with `data: [DONE]`. The proxy forwards the bytes as they come and, beside them, feeds
them here to rebuild the assistant message that the app ends up with (content, refusal
and tool calls merged by index), which is what gets recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"
MAX_EVENT = 8 * 1024 * 1024  # one event larger than this is not an OpenAI chunk


class StreamError(Exception):
    """The upstream stream is not server-sent events of chat completion chunks."""


class EventSplitter:
    """Bytes in, complete SSE `data` payloads out; tolerates `\\r\\n` and split reads."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        events: list[str] = []
        while True:
            end = self._buf.find(b"\n\n")
            if end < 0:
                if len(self._buf) > MAX_EVENT:
                    raise StreamError("an event in the upstream stream is too large")
                return events
            raw, self._buf = self._buf[:end], self._buf[end + 2 :]
            payload = _data_of(raw)
            if payload is not None:
                events.append(payload)


def _data_of(raw: bytes) -> str | None:
    """The event's data lines joined (comments and other fields are dropped)."""
    lines = []
    for line in raw.decode("utf-8", "replace").split("\n"):
        if line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    return "\n".join(lines) if lines else None


def parse_chunk(payload: str) -> dict[str, Any] | None:
    """A chunk object, or None for `[DONE]`; StreamError for anything else."""
    if payload.strip() == DONE:
        return None
    try:
        chunk = json.loads(payload)
    except ValueError as exc:
        raise StreamError(f"upstream sent an event that is not JSON: {payload[:80]!r}") from exc
    if not isinstance(chunk, dict):
        raise StreamError("upstream sent an event that is not a JSON object")
    return chunk


def encode_event(chunk: dict[str, Any] | str) -> bytes:
    """One SSE event as bytes (`[DONE]` passed as the string)."""
    text = (
        chunk
        if isinstance(chunk, str)
        else json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
    )
    return f"data: {text}\n\n".encode()


@dataclass
class _Call:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: str = ""


@dataclass
class ReplyAssembler:
    """Rebuilds choice 0's assistant message from its stream of deltas."""

    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    error: Any = None  # an `error` object sent inside the stream
    done: bool = False
    content_started: bool = False  # something was already sent (the proxy's own use)

    def add(self, chunk: dict[str, Any] | None) -> None:
        if chunk is None:
            self.done = True
            return
        if "error" in chunk and not chunk.get("choices"):
            self.error = chunk["error"]
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self.add_delta(choice.get("delta") or {})
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]

    def add_delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for i, part in enumerate(delta.get("tool_calls") or ()):
            if not isinstance(part, dict):
                continue
            call = self.calls.setdefault(int(part.get("index", i)), _Call())
            call.id = part.get("id") or call.id
            call.type = part.get("type") or call.type
            fn = part.get("function") or {}
            call.name += fn.get("name") or ""
            call.arguments += fn.get("arguments") or ""

    def tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": c.id, "type": c.type, "function": {"name": c.name, "arguments": c.arguments}}
            for _, c in sorted(self.calls.items())
        ]

    def message(self) -> dict[str, Any]:
        """The assistant message as the app will send it back in its next request."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.calls:
            message["tool_calls"] = self.tool_calls()
        return message
