"""What the compaction tests share: a test clock, the compaction config that points at the
fake LLM, and transcripts as memd writes them (the fixtures: `compaction_fixtures`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memd.compaction import Compactor
from memd.config import CompactionConfig
from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.markdown.transcript import Part
from tests.support.fake_llm import FakeLLM

T0 = datetime(2026, 11, 30, 2, 41, 7, tzinfo=UTC).timestamp()


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


class Clock:
    """A clock the test sets; a day after T0 unless told otherwise."""

    def __init__(self, now: float = T0 + 86_400) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config(fake: FakeLLM, **kw: object) -> CompactionConfig:
    """Compaction enabled against the fake LLM; `kw` overrides any key."""
    values: dict[str, Any] = {
        "enabled": True,
        "llm_model": "fake-model",
        "base_url": fake.base_url,
        "api_key": "sk-test",
    } | kw
    return CompactionConfig(**values)


async def started(comp: Compactor, *layouts: ClientLayout) -> Compactor:
    """Workers running, no timer (tests call `step`), the clients open."""
    await comp.start(schedule=False)
    for lay in layouts:
        await comp.open_client(lay)
    return comp


def exchange(n: int, user: str, start: float = T0) -> str:
    """Exchange `n` of a transcript, a minute after the one before."""
    when = datetime.fromtimestamp(start + 60 * n, UTC)
    return transcript.exchange_block(
        n, when, [Part("User", user), Part("Assistant", f"Noted {n}.")]
    )


def write_session(
    layout: ClientLayout,
    sid: str,
    exchanges: int = 3,
    *,
    start: float = T0,
    question: str = "Question",
    fact_prefix: str = "",
    filler: int = 0,
) -> bytes:
    """A session file exactly as memd's transcript module writes one."""
    text = transcript.front_matter(layout.client_id, sid, start)
    text += transcript.conversation_header(1, datetime.fromtimestamp(start, UTC))
    for n in range(1, exchanges + 1):
        user = f"{question} {n}: remember FACT-{fact_prefix}{n}. " + "blah " * filler
        text += exchange(n, user.strip(), start)
    data = text.encode()
    layout.session_file(sid).write_bytes(data)
    return data


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
