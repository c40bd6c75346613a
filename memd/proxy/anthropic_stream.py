"""The Messages API's stream: rebuild the message from its events, and its error shapes.

A streamed message is `message_start` (the message with empty content), per content
block `content_block_start` / `content_block_delta`* / `content_block_stop`, then
`message_delta` (stop_reason, usage) and `message_stop`; `ping` may come at any time and
`error` ends a stream that failed. The assembler rebuilds the message the app received
from the events it was sent, which is what gets recorded.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from memd.proxy.apis import named_event


class MessageAssembler:
    """Content blocks by index, from the events of one stream (or of several rounds)."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self.stop_reason: str | None = None
        self.done = False
        self.error: Any = None

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = {**event["message"], "content": []}
        elif kind == "content_block_start":
            self.blocks[int(event.get("index", 0))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            self._close(int(event.get("index", 0)))
        elif kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.error = event.get("error") or event

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + (delta.get("text") or "")
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")

    def _close(self, index: int) -> None:
        pieces = self._json.pop(index, None)
        block = self.blocks.get(index)
        if pieces is not None and block is not None:
            try:
                block["input"] = json.loads("".join(pieces) or "{}")
            except ValueError:
                block["input"] = {"_unparsed": "".join(pieces)}

    def content(self) -> list[dict[str, Any]]:
        return [block for _, block in sorted(self.blocks.items())]

    def whole(self) -> dict[str, Any] | None:
        """The message of a stream that ended properly, or None."""
        if not self.done or self.error is not None:
            return None
        return {**self.message, "content": self.content(), "stop_reason": self.stop_reason}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape (the SDKs read `error.type` and `error.message`)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, kind: str, message: str) -> web.Response:
    return web.json_response(
        error_body(kind, message), status=status, dumps=lambda v: json.dumps(v, ensure_ascii=False)
    )


def _timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError)


def failure_response(exc: BaseException, timeout: float) -> web.Response:
    """502/504 for an upstream that could not be reached or did not answer in time."""
    if _timeout(exc):
        return error_response(
            504, "timeout_error", f"the upstream did not answer within {timeout:g} s"
        )
    return error_response(502, "api_error", f"cannot reach the upstream: {exc}")


def failure_event(exc: BaseException) -> bytes:
    """The `error` event sent into a stream that broke off (the SDKs raise it)."""
    if _timeout(exc):
        text = "the upstream stopped sending before the answer was complete"
        return named_event(error_body("timeout_error", text))
    text = f"the upstream stream broke off before the answer was complete: {exc}"
    return named_event(error_body("api_error", text))
