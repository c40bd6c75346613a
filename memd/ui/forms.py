"""Reading what a browser sends: path parts, query fields and forget selectors, checked."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from aiohttp import web

from memd.config import CLIENT_ID_RE

MAX_FIELD = 2000  # characters of one text field (a query, a time)
_EXCHANGE_RE = re.compile(r" · exchange (\d+)(?: ·| —|$)")
SELECTOR_FIELDS = ("session_id", "conversation", "after", "before", "query")


def bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=message + "\n", content_type="text/plain")


def client_of(request: web.Request) -> str:
    client = request.match_info["client"]
    if not CLIENT_ID_RE.match(client) or client in (".", ".."):
        raise bad(f"{client[:80]!r} is not a client id")
    return client


def number(value: str | None, name: str, minimum: int = 0) -> int:
    if value is None or not value.isdigit() or len(value) > 9 or int(value) < minimum:
        raise bad(f"{name} must be a whole number of at least {minimum}")
    return int(value)


def text_param(request: web.Request, name: str) -> str:
    value = request.query.get(name, "").strip()
    if len(value) > MAX_FIELD:
        raise bad(f"{name} is longer than {MAX_FIELD} characters")
    return value


def exchange_number(heading: str) -> int | None:
    """The exchange number of a transcript heading (`<time> · exchange N — title`)."""
    m = _EXCHANGE_RE.search(heading)
    return int(m.group(1)) if m else None


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def selector(fields: Any) -> dict[str, Any]:
    """`memory.forget` selector params from a form or query (one selector; memd checks)."""
    params: dict[str, Any] = {}
    for name in SELECTOR_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value.strip():
            if len(value) > MAX_FIELD:
                raise bad(f"{name} is longer than {MAX_FIELD} characters")
            params[name] = value.strip()
    conversation = params.pop("conversation", None)
    if conversation is not None:
        params["conversation_id"] = number(conversation, "conversation")
    if not params:
        raise bad("say what to forget: a session, a conversation, a time range or a query")
    return params
