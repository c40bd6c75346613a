"""One recording model: what the Messages and Responses APIs carry, as chat messages.

memd records every API through `memory.record_chat`, whose input is OpenAI chat
messages: user and assistant text, the assistant's tool calls, tool results. The Anthropic
Messages API and the OpenAI Responses API are turned into exactly that here, so that a
conversation looks the same in a transcript, in recall, in export and in compaction
whichever API carried it (the chat path records its messages as they are).

The conversion is deterministic and the same for a reply and for that reply resent by
the app in its next request, so memd's prefix hashes see turn 2 continue turn 1.
Payloads that are not text (images, documents, thinking, reasoning) are forwarded
upstream untouched but recorded only as a noted part (`[image]`, `[file: title]`,
`[thinking]`) keyed by a digest of their data, never with the data itself.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

Message = dict[str, Any]


def digest(value: Any) -> str:
    """A short stable key for a payload that is noted, not recorded."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def noted(kind: str, payload: Any) -> dict[str, Any]:
    """A part memd renders as `[kind]`: the payload enters only as a digest."""
    return {"type": kind, "digest": digest(payload)}


def text_part(text: Any) -> dict[str, Any]:
    return {"type": "text", "text": text if isinstance(text, str) else ""}


def _call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": call_id if isinstance(call_id, str) else None,
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": arguments},
    }


def _finish(message: Message) -> Message:
    """An assistant message under construction, in the shape record_chat takes."""
    if not message.get("content"):
        message["content"] = None
    if not message.get("tool_calls"):
        message.pop("tool_calls", None)
    return message


# --- Anthropic Messages ---------------------------------------------------------------


def anthropic_part(block: Any) -> dict[str, Any]:
    """One content block as a chat content part (text as text, the rest noted)."""
    if not isinstance(block, dict):
        return text_part(block if isinstance(block, str) else "")
    kind = block.get("type")
    if kind == "text":
        return text_part(block.get("text"))
    if kind == "image":
        return noted("image", block.get("source"))
    if kind == "document":
        title = block.get("title")
        name = title if isinstance(title, str) and title else "document"
        return {"type": "file", "file": {"filename": name, "digest": digest(block.get("source"))}}
    if kind == "thinking":
        return noted("thinking", block.get("signature") or block.get("thinking"))
    if kind == "redacted_thinking":
        return noted("redacted_thinking", block.get("data"))
    return noted(str(kind or "block"), block)


def anthropic_system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(
            b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def anthropic_reply(content: Any) -> Message:
    """An assistant message (its content blocks) as the chat assistant message."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use"):
            calls.append(_call(block.get("id"), block.get("name"), block.get("input")))
        else:
            parts.append(anthropic_part(block))
    return _finish({"role": "assistant", "content": parts, "tool_calls": calls})


def _anthropic_user(content: Any) -> list[Message]:
    """A user turn: its tool results become tool messages, its other blocks one message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[Message] = []
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "tool_result":
            result = block.get("content")
            shown = result if isinstance(result, str) else [anthropic_part(b) for b in result or ()]
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": shown})
        else:
            parts.append(anthropic_part(block))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def anthropic_messages(body: dict[str, Any]) -> list[Message]:
    """A Messages API request (system and messages) as chat messages."""
    out: list[Message] = []
    system = anthropic_system(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            out.append(anthropic_reply(message.get("content")))
        else:
            out.extend(_anthropic_user(message.get("content")))
    return out


# --- OpenAI Responses -----------------------------------------------------------------


def _response_part(part: Any) -> dict[str, Any]:
    if isinstance(part, str):
        return text_part(part)
    if not isinstance(part, dict):
        return text_part("")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return text_part(part.get("text"))
    if kind == "refusal":
        return {"type": "refusal", "refusal": part.get("refusal") or ""}
    if kind == "input_image":
        return noted("image", part.get("image_url") or part.get("file_id"))
    if kind == "input_file":
        name = part.get("filename") if isinstance(part.get("filename"), str) else "file"
        payload = part.get("file_id") or part.get("file_data") or part.get("file_url")
        return {"type": "file", "file": {"filename": name, "digest": digest(payload)}}
    return noted(str(kind or "part"), part)


def _content(content: Any) -> Any:
    if isinstance(content, str) or content is None:
        return content
    return [_response_part(p) for p in content] if isinstance(content, list) else None


def response_items(items: Any) -> list[Message]:
    """Responses input or output items as chat messages; consecutive assistant items
    (its text, reasoning, function calls) make one assistant message, as one reply."""
    out: list[Message] = []
    open_reply: Message | None = None

    def reply() -> Message:
        nonlocal open_reply
        if open_reply is None:
            open_reply = {"role": "assistant", "content": [], "tool_calls": []}
            out.append(open_reply)
        return open_reply

    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind == "message" and role == "assistant":
            content = _content(item.get("content"))
            parts = [text_part(content)] if isinstance(content, str) else content or []
            reply()["content"].extend(parts)
        elif kind == "message":
            open_reply = None
            out.append({"role": role, "content": _content(item.get("content"))})
        elif kind == "function_call":
            reply()["tool_calls"].append(
                _call(item.get("call_id"), item.get("name"), item.get("arguments"))
            )
        elif kind == "function_call_output":
            open_reply = None
            output = item.get("output")
            shown = output if isinstance(output, str) else _content(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": shown})
        else:  # reasoning, hosted tool calls, item references: noted in the reply
            reply()["content"].append(noted(str(kind or "item"), item.get("id") or item))
    for message in out:
        if message["role"] == "assistant":
            _finish(message)
    return out


def responses_input(body: dict[str, Any], with_instructions: bool) -> list[Message]:
    """A Responses request's `instructions` (when asked) and `input` as chat messages."""
    out: list[Message] = []
    instructions = body.get("instructions")
    if with_instructions and isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
    else:
        out.extend(response_items(given))
    return out


def responses_reply(output: Any) -> Message:
    """A response's output items as the one assistant message the app received."""
    merged: Message = {"role": "assistant", "content": [], "tool_calls": []}
    for message in response_items(output):
        if message["role"] == "assistant":
            merged["content"].extend(message.get("content") or [])
            merged["tool_calls"].extend(message.get("tool_calls") or [])
    return _finish(merged)
