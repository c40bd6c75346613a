"""The upstream side: which headers cross the proxy, the upstream URL, and error answers.

Everything the app sends passes through unchanged except what identifies the hop: the
app's bearer key (memd's key, which must never leave the machine), hop-by-hop headers,
Host, and the body's length and encoding, which aiohttp sets for the body it sends.
The upstream key comes from memd's config only, never from SDK environment variables.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

# RFC 9110 §7.6.1 hop-by-hop headers, plus what the proxy sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Credentials of the app's hop (memd's key in any of the usual spellings) and cookies.
APP_CREDENTIALS = frozenset({"authorization", "api-key", "x-api-key", "cookie"})
# Compression is off upstream (identity), so a relayed body's length stays true.
REQUEST_DROP = HOP_BY_HOP | APP_CREDENTIALS | {"accept-encoding"}
RESPONSE_DROP = HOP_BY_HOP | {"content-encoding", "set-cookie"}


def upstream_url(base_url: str, path: str, query: str = "", keep_v1: bool = False) -> str:
    """`/v1/chat/completions` on `https://host/v1` -> `https://host/v1/chat/completions`;
    with `keep_v1` (Anthropic's base URLs end before `/v1`) the whole path is appended."""
    keep_v1 = keep_v1 and not base_url.rstrip("/").endswith("/v1")
    tail = path if keep_v1 else path.removeprefix("/v1")
    url = base_url.rstrip("/") + tail
    return f"{url}?{query}" if query else url


def request_headers(incoming: Any, api_key: str, anthropic: bool = False) -> CIMultiDict[str]:
    """The app's headers less its credentials; the upstream key as that API expects it."""
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in incoming.items():
        if key.lower() not in REQUEST_DROP:
            headers.add(key, value)
    if api_key and anthropic:
        headers["x-api-key"] = api_key
    elif api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def response_headers(upstream: aiohttp.ClientResponse, keep_length: bool) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in upstream.headers.items():
        lower = key.lower()
        if lower not in RESPONSE_DROP or (keep_length and lower == "content-length"):
            headers.add(key, value)
    return headers


def is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.content_type == "text/event-stream"


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape, so SDKs show `message` and apps branch on `code`."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_response(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    return web.json_response(
        error_body(message, kind, code),
        status=status,
        dumps=lambda v: json.dumps(v, ensure_ascii=False),
    )


def failure_response(exc: BaseException, timeout: float) -> web.Response:
    """502/504 for an upstream that could not be reached or did not answer in time."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return error_response(
            504,
            f"the upstream did not answer within {timeout:g} s",
            "upstream_error",
            "upstream_timeout",
        )
    return error_response(
        502, f"cannot reach the upstream: {exc}", "upstream_error", "upstream_unreachable"
    )


def failure_event(exc: BaseException) -> dict[str, Any]:
    """The error sent inside a stream that already began: the SDKs raise it as APIError."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return error_body(
            "the upstream stopped sending before the answer was complete",
            "upstream_error",
            "upstream_timeout",
        )
    return error_body(
        f"the upstream stream broke off before the answer was complete: {exc}",
        "upstream_error",
        "upstream_stream_dropped",
    )
