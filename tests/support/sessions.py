"""Library-level session tests' shared pieces: a settable clock and ClientSessions on it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from memd.layout import ClientLayout
from memd.sessions.tracker import ClientSessions

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


class Clock:
    """Epoch seconds that only move when a test says so."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, minutes: float) -> None:
        self.t += minutes * 60

    def at(self, minutes: float) -> None:
        """Set the clock to T0 + minutes."""
        self.t = T0 + minutes * 60


def archive(layout: ClientLayout, session_id: str) -> Path:
    """Move a raw transcript into archive/ by hand, as a compaction's file step would."""
    src, dst = layout.session_file(session_id), layout.archive_file(session_id)
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.replace(src, dst)
    return dst


def run(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(fn())


@contextlib.asynccontextmanager
async def open_sessions(
    root: Path, clock: Clock, client: str = "c1", **kw: Any
) -> AsyncIterator[ClientSessions]:
    """ClientSessions for `client` under `root` (30-minute inactivity unless given)."""
    kw.setdefault("inactivity_minutes", 30)
    async with ClientSessions(ClientLayout(root, client), clock=clock, **kw) as cs:
        yield cs
