"""Record-call input checked: OpenAI chat messages and their hash keys, the other arguments.

Each message gets a canonical key: role, name, tool_call_id, tool calls (arguments
re-serialised when they are JSON) and its content as text, NFC-normalised with every
whitespace run collapsed to one space. Content given as a list of parts hashes like the
same text given as a string, so a client that switches between the two forms still
matches. Images and other binary parts enter the key as a digest of their data.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memd.errors import InvalidParams
from memd.markdown import Part, clean_text, label

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_CONVERSATION_ID = 256
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


class InvalidRecord(InvalidParams, ValueError):
    """Unusable arguments to a record call; an InvalidParams, so JSON-RPC -32602."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, data={"field": field})
        self.field = field


@dataclass(frozen=True, slots=True)
class Message:
    """A validated chat message: its role and hash key; `parts` renders it for the transcript.

    Rendering is deferred because only the new messages of a request are ever written,
    while every message of a long history is validated and hashed on each request.
    """

    role: str
    key: bytes
    raw: dict[str, Any]

    @property
    def parts(self) -> tuple[Part, ...]:
        return _analyse(self.raw, "message", render=True)[1]


def parse_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRecord("messages must be a non-empty list of chat messages", "messages")
    return [parse_message(m, f"messages[{i}]") for i, m in enumerate(raw)]


def parse_response(raw: Any) -> Message:
    if isinstance(raw, dict) and "choices" in raw and "role" not in raw:
        raise InvalidRecord(
            "response must be the assistant message (choices[0].message), not the whole completion",
            "response",
        )
    if isinstance(raw, dict) and raw.get("role", "assistant") != "assistant":
        raise InvalidRecord("response.role must be 'assistant'", "response.role")
    if isinstance(raw, dict) and "role" not in raw:
        raw = {**raw, "role": "assistant"}
    return parse_message(raw, "response")


def parse_message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise InvalidRecord(f"{where} must be an object", where)
    key = _analyse(raw, where, render=False)[0]  # checks the role first
    return Message(raw["role"], key, raw)


def _analyse(raw: dict[str, Any], where: str, *, render: bool) -> tuple[bytes, tuple[Part, ...]]:
    """Validate; the hash key, and (with `render`) the readable parts."""
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRecord(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
    name = _optional_str(raw, "name", where)
    call_id = _optional_str(raw, "tool_call_id", where)
    shown, hashed = _content(raw.get("content"), f"{where}.content", render)
    calls_key, call_parts = _calls(raw, where, render) if role == "assistant" else ("", [])
    if name is None and call_id is None and not calls_key:
        head = role
    else:
        head = json.dumps([role, name, call_id, calls_key], ensure_ascii=False)
    key = (head + "\n" + _normalise(hashed)).encode("utf-8", "surrogatepass")
    if not render:
        return key, ()
    return key, tuple(_parts(role, name, call_id, shown, call_parts))


def _parts(
    role: str, name: str | None, call_id: str | None, shown: str, call_parts: list[Part]
) -> list[Part]:
    if role == "tool":
        detail = " · ".join(x for x in (name, call_id) if x)
        return [Part(label("Tool", detail), shown)]
    base = {
        "user": "User",
        "system": "System",
        "developer": "Developer",
        "assistant": "Assistant",
        "function": "Function",
    }[role]
    parts = [Part(label(base, name or ""), shown)] if shown or not call_parts else []
    return parts + call_parts


def _calls(raw: dict[str, Any], where: str, render: bool) -> tuple[str, list[Part]]:
    """Canonical key text and readable parts of an assistant's tool_calls / function_call."""
    calls = raw.get("tool_calls")
    keys: list[Any] = []
    parts: list[Part] = []
    if calls is not None:
        if not isinstance(calls, list):
            raise InvalidRecord(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        for i, call in enumerate(calls):
            at = f"{where}.tool_calls[{i}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise InvalidRecord(f"{at} must have a function with a name", at)
            call_id = _optional_str(call, "id", at)
            args_key, args_shown = _arguments(
                fn.get("arguments"), f"{at}.function.arguments", render
            )
            keys.append([call_id, call.get("type", "function"), fn["name"], args_key])
            detail = " · ".join(x for x in (fn["name"], call_id) if x)
            parts.append(Part(label("Tool call", detail), args_shown))
    legacy = raw.get("function_call")
    if legacy is not None:
        if not isinstance(legacy, dict) or not isinstance(legacy.get("name"), str):
            raise InvalidRecord(f"{where}.function_call must have a name", f"{where}.function_call")
        args_key, args_shown = _arguments(legacy.get("arguments"), f"{where}.function_call", render)
        keys.append(["function_call", legacy["name"], args_key])
        parts.append(Part(label("Function call", legacy["name"]), args_shown))
    return (json.dumps(keys, ensure_ascii=False) if keys else ""), parts


def _arguments(value: Any, where: str, render: bool) -> tuple[str, str]:
    """Tool-call arguments: JSON re-serialised canonically for the key, as given for reading."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        shown = clean_text(value) if render else ""
        try:
            parsed = json.loads(value)
            return _canonical(parsed), shown
        except (ValueError, RecursionError):  # not JSON, or nested too deeply: plain text
            return _normalise(value), shown
    if isinstance(value, dict | list):
        try:
            shown = clean_text(json.dumps(value, ensure_ascii=False)) if render else ""
            return _canonical(value), shown
        except RecursionError:
            raise InvalidRecord(f"{where} is nested too deeply", where) from None
    raise InvalidRecord(f"{where} must be a string or an object", where)


def _canonical(parsed: Any) -> str:
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _content(value: Any, where: str, render: bool) -> tuple[str, str]:
    """(text for the transcript if `render`, text for the hash key) of a message's content."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        return (clean_text(value) if render else ""), value
    if not isinstance(value, list):
        raise InvalidRecord(f"{where} must be a string, null or a list of parts", where)
    shown: list[str] = []
    hashed: list[str] = []
    for i, part in enumerate(value):
        s, h = _content_part(part, f"{where}[{i}]", render)
        shown.append(s)
        hashed.append(h)
    return "\n".join(shown), "\n".join(hashed)


def _content_part(part: Any, where: str, render: bool) -> tuple[str, str]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise InvalidRecord(f"{where} must be an object with a type", where)
    kind = part["type"]
    if kind in _TEXT_PARTS or kind == "refusal":
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise InvalidRecord(f"{where} must carry a string", where)
        return (clean_text(text) if render else ""), text
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise InvalidRecord(f"{where}.image_url.url must be a string", where)
        web = url.startswith(("http://", "https://")) and len(url) <= 300
        return (f"[image: {clean_text(url)}]" if web else "[image]"), f"[image {_digest(url)}]"
    if kind == "file":
        given = part.get("file")
        file = given if isinstance(given, dict) else {}
        name = file.get("filename")
        shown = f"[file: {clean_text(name)}]" if isinstance(name, str) else "[file]"
        return shown, f"[file {_digest(json.dumps(file, sort_keys=True, default=str))}]"
    body = json.dumps(part, sort_keys=True, default=str)
    return f"[{clean_text(kind)}]", f"[{kind} {_digest(body)}]"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _normalise(text: str) -> str:
    """Whitespace runs to one space, NFC: what a resending client may change, ignored."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def _optional_str(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRecord(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


# --- the other record arguments ------------------------------------------------------------


def require_text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(f"{field} must be a string", field)
    return clean_text(value)


def check_conversation_id(value: Any) -> str:
    """An MCP session id is opaque data (never used in a path), but it must be sane."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord("conversation_id must be a non-empty string", "conversation_id")
    if len(value) > MAX_CONVERSATION_ID:
        raise InvalidRecord(
            f"conversation_id is longer than {MAX_CONVERSATION_ID} characters", "conversation_id"
        )
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
        raise InvalidRecord(
            "conversation_id must not contain control characters", "conversation_id"
        )
    return value


def parse_timestamp(value: Any) -> datetime | None:
    """ISO 8601 (for imports) as an aware UTC datetime; a time without an offset is UTC."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise InvalidRecord("timestamp must be an ISO 8601 string", "timestamp")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidRecord(f"timestamp {value!r} is not ISO 8601", "timestamp") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidRecord(f"timestamp {value!r} is out of range", "timestamp") from None
