"""Record-call input scrubbed before it is checked, hashed, rendered or written.

Both record methods pass through here, whatever front end sent them (the socket, the
proxy's three APIs, the hooks, imports): `record_chat`'s raw messages and reply are
rewritten with every text in them scrubbed (content strings and text parts, refusals,
tool-call arguments, whether a JSON string or an object), `record_exchange`'s two
texts likewise. Only then are messages keyed and hashed, so a stored hash never covers a
secret, and a resent history scrubs to the same keys: a continuation is still one
(memd.redaction's scrubbing is deterministic). `<private>` spans are dropped from user
messages only; an assistant quoting the tag is left alone.

Anything malformed is passed on untouched: memd.sessions.messages refuses it with the
error that names the field.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from memd.redaction import Scrubbed, Scrubber

_TEXT_KEYS = ("text", "refusal")


def scrub_chat(
    scrubber: Scrubber, messages: Any, response: Any
) -> tuple[Any, Any, list[Scrubbed | None]]:
    """Scrubbed copies of a record_chat call's messages and reply, and each one's
    outcome (the reply's last; None where nothing was replaced)."""
    if not isinstance(messages, list):
        return messages, response, []
    out: list[Any] = []
    counts: list[Scrubbed | None] = []
    for message in [*messages, response]:
        clean, seen = _message(scrubber, message)
        out.append(clean)
        counts.append(seen)
    return out[:-1], out[-1], counts


def scrub_pair(scrubber: Scrubber, user: str, assistant: str) -> tuple[str, str, Counter[str]]:
    """An exchange's two texts scrubbed (`<private>` spans from the user's), and what was
    replaced by kind: for record_exchange and every other method that takes one pair."""
    asked = scrubber.scrub(user, private=True)
    said = scrubber.scrub(assistant)
    return asked.text, said.text, asked.kinds + said.kinds


def _message(scrubber: Scrubber, raw: Any) -> tuple[Any, Scrubbed | None]:
    if not isinstance(raw, dict):
        return raw, None
    tally = Scrubbed("")
    private = raw.get("role") == "user"

    def text(value: str) -> str:
        done = scrubber.scrub(value, private=private)
        tally.kinds.update(done.kinds)
        return done.text

    out = dict(raw)
    content = raw.get("content")
    if isinstance(content, str):
        out["content"] = text(content)
    elif isinstance(content, list):
        out["content"] = [_part(part, text) for part in content]
    if isinstance(raw.get("tool_calls"), list):
        out["tool_calls"] = [_call(call, "function", text) for call in raw["tool_calls"]]
    if isinstance(raw.get("function_call"), dict):
        out["function_call"] = _arguments(raw["function_call"], text)
    return out, (tally if tally.count else None)


def _part(part: Any, text: Any) -> Any:
    if not isinstance(part, dict):
        return part
    out = dict(part)
    for key in _TEXT_KEYS:
        if isinstance(part.get(key), str):
            out[key] = text(part[key])
    return out


def _call(call: Any, key: str, text: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get(key), dict):
        return call
    return {**call, key: _arguments(call[key], text)}


def _arguments(fn: dict[str, Any], text: Any) -> dict[str, Any]:
    args = fn.get("arguments")
    if isinstance(args, str):
        return {**fn, "arguments": text(args)}
    if isinstance(args, dict | list):
        try:
            return {**fn, "arguments": _walk(args, text)}
        except RecursionError:  # nothing that cannot be scrubbed is kept
            return {**fn, "arguments": "[redacted: unreadable]"}
    return fn


def _walk(value: Any, text: Any) -> Any:
    """Every string in a JSON value scrubbed (keys kept)."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        return {k: _walk(v, text) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, text) for v in value]
    return value
