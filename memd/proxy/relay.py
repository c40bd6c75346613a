"""Forwarding one request upstream and its answer back, byte for byte, as it arrives.

Bodies are streamed, not buffered: a long stream goes out chunk by chunk as the upstream
sends it, and a `tee` sees the same bytes to rebuild the reply for recording. When the
upstream breaks off mid-answer, the app must not mistake the part for a whole answer:
a stream gets an OpenAI-style `error` event (the SDKs raise it) and the connection is
then cut without the closing chunk, so any HTTP client sees a truncated body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from memd.proxy import upstream as up
from memd.proxy.stream import EventSplitter, ReplyAssembler, StreamError, encode_event, parse_chunk

MAX_RECORDED_BODY = 16 * 1024 * 1024  # a non-streamed answer larger than this is not recorded


@dataclass(frozen=True)
class Settings:
    """The upstream settings one request runs with (a config reload applies to the next)."""

    base_url: str
    api_key: str
    connect_timeout: float
    read_timeout: float
    max_tool_rounds: int
    anthropic: bool = False  # the Messages API: its own URL form and `x-api-key`


class UpstreamFailed(Exception):
    """The upstream could not be reached or did not answer in time (before any byte)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def send(
    session: aiohttp.ClientSession, settings: Settings, request: web.Request, data: bytes
) -> aiohttp.ClientResponse:
    """Open the upstream request; the caller reads and releases the response."""
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
    )
    url = up.upstream_url(
        settings.base_url, request.path, request.query_string, keep_v1=settings.anthropic
    )
    headers = up.request_headers(request.headers, settings.api_key, settings.anthropic)
    try:
        return await session.request(
            request.method,
            url,
            headers=headers,
            data=data if data else None,
            timeout=timeout,
            skip_auto_headers=("Accept-Encoding",),
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamFailed(exc) from exc


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    tee: Callable[[bytes], None] | None = None,
    failure: Callable[[BaseException], bytes] | None = None,
) -> tuple[web.StreamResponse, bool]:
    """Send the upstream's answer on as it arrives; the flag is False when it broke off.

    `failure` makes the event sent into a stream that broke off (each API has its own)."""
    keep_length = "content-encoding" not in upstream.headers
    response = web.StreamResponse(
        status=upstream.status,
        reason=upstream.reason,
        headers=up.response_headers(upstream, keep_length),
    )
    await response.prepare(request)
    try:
        async for data in upstream.content.iter_any():
            if tee is not None:
                tee(data)
            await response.write(data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        if up.is_event_stream(upstream):
            with contextlib.suppress(Exception):
                await response.write(
                    failure(exc) if failure else encode_event(up.failure_event(exc))
                )
        cut(request)
        return response, False
    await response.write_eof()
    return response, True


def cut(request: web.Request) -> None:
    """Close the app's connection without ending the body, so a part is never a whole."""
    transport = request.transport
    if transport is not None:
        transport.abort()


class Tee:
    """Keeps what is needed to record a relayed answer: the reply it carried."""

    def __init__(self, streamed: bool) -> None:
        self.streamed = streamed
        self.usable = True
        self._body = bytearray()
        self._splitter = EventSplitter()
        self._assembler = ReplyAssembler()

    def __call__(self, data: bytes) -> None:
        if not self.usable:
            return
        if not self.streamed:
            self._body += data
            self.usable = len(self._body) <= MAX_RECORDED_BODY
            return
        try:
            for payload in self._splitter.feed(data):
                self._assembler.add(parse_chunk(payload))
        except StreamError:
            self.usable = False

    def reply(self) -> dict[str, Any] | None:
        """The assistant message of a complete answer, or None when there is none to record."""
        if not self.usable:
            return None
        if self.streamed:
            done = self._assembler.done or self._assembler.finish_reason is not None
            return self._assembler.message() if done and self._assembler.error is None else None
        return first_message(bytes(self._body))


def first_message(body: bytes) -> dict[str, Any] | None:
    """choices[0].message of a chat completion body, or None if it has none."""
    try:
        data = json.loads(body)
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return message if isinstance(message, dict) else None


async def release(upstream: aiohttp.ClientResponse) -> None:
    """Close an upstream answer that was not read to the end (its connection is not reused)."""
    upstream.close()
    await asyncio.sleep(0)
