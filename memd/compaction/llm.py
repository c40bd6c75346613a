"""LLM calls for compaction: one prompt per call, bounded by a timeout, and bounded requests.

`complete` sends one prompt and makes the same request memsearch's compaction makes
(`memsearch.compact.summarize_text`: one user message; for anthropic max_tokens 4096 and
the first text block). memd builds each SDK client itself instead of calling memsearch's
functions, for three reasons found in memsearch 0.4.23: its anthropic and gemini paths
read the key only from ANTHROPIC_API_KEY / GOOGLE_API_KEY, and setting those in
`os.environ` would hand one setting to the whole daemon; its openai path never closes the
client it makes per call, so a keep-alive socket lingers until the garbage collector
finds it; and it imports the SDK on the event loop (0.35 s for openai). Here the key and
base URL are passed to the client, the client is closed after the call, and `warm_up`
imports the SDK in a thread.

`summarize` (memd.compaction.bounded, re-exported here) bounds what any single request
carries: every prompt is at most `max_request_chars` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import structlog

from memd.compaction.bounded import (  # re-exported: callers know them as llm.*
    DEFAULT_MAX_REQUEST_CHARS as DEFAULT_MAX_REQUEST_CHARS,
)
from memd.compaction.bounded import MIN_REQUEST_CHARS as MIN_REQUEST_CHARS
from memd.compaction.bounded import Complete as Complete
from memd.compaction.bounded import Summary as Summary
from memd.compaction.bounded import split_text as split_text
from memd.compaction.bounded import summarize as summarize
from memd.compaction.usage import Usage, reported
from memd.config import CompactionConfig
from memd.sdk_env import is_sdk_variable  # every SDK variable, one list (memd.sdk_env)

log = structlog.get_logger()

# memsearch 0.4.23's own defaults; resolved here so a summary records the model used.
DEFAULT_MODELS = {
    "openai": "gpt-5-mini",
    "anthropic": "claude-sonnet-4-6",
    "gemini": "gemini-3-flash-preview",
}
DEFAULT_TIMEOUT = 120.0

Answer = tuple[str, tuple[int, int] | None]  # the text, and the API's (input, output) tokens


class LLMError(Exception):
    """A failed LLM call; `reason` is one of unreachable, http_error, timeout, empty, setup."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class LLMSettings:
    """Everything one call needs; built from the config so a reload takes effect next call."""

    provider: str = "openai"
    model: str = DEFAULT_MODELS["openai"]
    base_url: str = ""
    api_key: str = field(default="", repr=False)
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_config(cls, config: CompactionConfig, timeout: float = DEFAULT_TIMEOUT) -> LLMSettings:
        provider = config.llm_provider
        return cls(
            provider=provider,
            model=config.llm_model or DEFAULT_MODELS.get(provider, ""),
            base_url=config.base_url,
            api_key=config.api_key,
            timeout=timeout,
        )


# --- one call -----------------------------------------------------------------------------


async def complete(settings: LLMSettings, prompt: str, *, usage: Usage | None = None) -> str:
    """The LLM's answer to `prompt`; raises LLMError, never hangs past `settings.timeout`.

    The timeout covers the whole call, including the quick retries the OpenAI SDK makes
    on its own for 429/5xx/connection errors; memd's slower backoff sits above it. An
    answered call's tokens are added to `usage` (the API's counts, else an estimate).
    """
    await warm_up(settings.provider)  # outside the timeout: an import is not the LLM's time
    try:
        async with asyncio.timeout(settings.timeout):
            text, counts = await _call(settings, prompt)
    except TimeoutError as exc:
        raise LLMError("timeout", f"no answer within {settings.timeout:g} s") from exc
    except LLMError:
        raise
    except Exception as exc:
        raise _classify(exc) from exc
    if usage is not None:
        usage.record(prompt, text if isinstance(text, str) else "", counts)
    if not isinstance(text, str) or not text.strip():
        raise LLMError("empty", "the LLM returned empty content")
    return text


async def warm_up(provider: str) -> None:
    """Import the provider's SDK in a thread, so the first call does not stall the loop.

    Done at the first call, not at start-up: a daemon that never compacts (no key, or
    sessions still open) does not pay the SDK's import (openai: ~1.5 s of CPU, and
    readiness waited for it).
    """
    module = {"openai": "openai", "anthropic": "anthropic", "gemini": "google.genai"}.get(provider)
    if module and module not in sys.modules:
        with contextlib.suppress(ImportError):
            await asyncio.to_thread(importlib.import_module, module)


async def _call(settings: LLMSettings, prompt: str) -> Answer:
    if settings.provider == "openai":
        return await _openai(settings, prompt)
    if settings.provider == "anthropic":
        return await _anthropic(settings, prompt)
    if settings.provider == "gemini":
        return await _gemini(settings, prompt)
    raise LLMError("setup", f"unknown LLM provider {settings.provider!r}")


# The official endpoints, named so no SDK ever picks a base URL from its environment.
OFFICIAL_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
}
# One per process, as os.environ is: a lock per Compactor would let two of them move the
# same variables aside at once (docs/architecture.md, "State and threads").
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _sdk_env_hidden() -> Iterator[None]:
    """Build an SDK client with its environment variables out of sight.

    The SDKs fill every setting that is not passed from the environment: openai reads
    OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_ORG_ID, OPENAI_PROJECT_ID and
    OPENAI_CUSTOM_HEADERS, anthropic ANTHROPIC_AUTH_TOKEN and ANTHROPIC_BASE_URL, google-genai
    GOOGLE_API_KEY and the Vertex AI switches. Passing a value blocks some of these, not
    all (custom headers and organisation have no "none" value), and a variable set for
    some other program must never decide where a transcript goes (issue #14). They read
    the environment only while the client is constructed, so the variables are moved
    aside for that moment, on the event loop, under a lock, and put back.
    """
    with _ENV_LOCK:
        saved = {k: v for k, v in os.environ.items() if is_sdk_variable(k)}
        for key in saved:
            del os.environ[key]
        try:
            yield
        finally:
            os.environ.update(saved)


def _endpoint(settings: LLMSettings) -> tuple[str, str]:
    """(base URL, key) from the config alone; an official endpoint needs a configured key.

    A custom base URL (a local model server) often needs no key, but the SDKs refuse to
    start without one: it gets a placeholder, never the user's key from the environment.
    """
    base_url = settings.base_url or OFFICIAL_BASE_URLS.get(settings.provider, "")
    if settings.api_key:
        return base_url, settings.api_key
    if settings.base_url:
        return base_url, "memd-no-key"
    raise LLMError(
        "setup",
        f"compaction.api_key is not set for {settings.provider}'s own "
        "endpoint (memd never reads SDK environment variables; write "
        'api_key = "env:VAR" in [compaction] to use one)',
    )


async def _openai(settings: LLMSettings, prompt: str) -> Answer:
    """memsearch's `_compact_openai`, with a client that is closed after the call."""
    import openai

    base_url, key = _endpoint(settings)
    with _sdk_env_hidden():
        client = openai.AsyncOpenAI(api_key=key, base_url=base_url, timeout=settings.timeout)
    async with client:
        resp = await client.chat.completions.create(
            model=settings.model, messages=[{"role": "user", "content": prompt}]
        )
    text = (resp.choices[0].message.content or "") if resp.choices else ""
    return text, reported(resp)


async def _anthropic(settings: LLMSettings, prompt: str) -> Answer:
    """memsearch's `_compact_anthropic`, with the key and base URL passed in."""
    base_url, key = _endpoint(settings)
    try:
        import anthropic
    except ImportError as exc:
        raise LLMError(
            "setup",
            "llm_provider anthropic needs the anthropic package "
            "(pip install 'memsearch[anthropic]')",
        ) from exc
    with _sdk_env_hidden():
        client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url, timeout=settings.timeout)
    async with client:
        resp = await client.messages.create(
            model=settings.model, max_tokens=4096, messages=[{"role": "user", "content": prompt}]
        )
    for block in resp.content:  # a thinking block may come before the text
        if block.type == "text":
            return block.text, reported(resp)
    return "", reported(resp)


async def _gemini(settings: LLMSettings, prompt: str) -> Answer:
    """memsearch's `_compact_gemini`, with the key and base URL passed in."""
    base_url, key = _endpoint(settings)
    try:
        from google import genai
        from google.genai import types
    except ImportError as exc:
        raise LLMError(
            "setup",
            "llm_provider gemini needs the google-genai package (pip install 'memsearch[google]')",
        ) from exc
    options = types.HttpOptions(base_url=base_url, timeout=int(settings.timeout * 1000))
    with _sdk_env_hidden():
        client = genai.Client(api_key=key, vertexai=False, http_options=options)
    resp = await client.aio.models.generate_content(model=settings.model, contents=prompt)
    return resp.text or "", reported(resp)


def _classify(exc: Exception) -> LLMError:
    """Name the failure the way status and logs show it, without provider imports."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    if "Timeout" in name:
        return LLMError("timeout", f"{name}: {exc}")
    if "Connection" in name or isinstance(exc, OSError):
        return LLMError("unreachable", f"{name}: {exc}")
    if isinstance(status, int):
        text = re.sub(r"^Error code: \d+ - ", "", str(exc))  # the SDK's own prefix
        return LLMError("http_error", f"HTTP {status}: {_short(text)}")
    if "api_key" in str(exc) or "credentials" in str(exc).lower():
        return LLMError("setup", f"{name}: {exc}")
    return LLMError("http_error", f"{name}: {_short(str(exc))}")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
