"""Which compactions are due when, which wait in the queue, and which run: keys only.

The Compactor decides what a compaction does and when it is due (`step(now)`); this is
the bookkeeping it does that with, so every key is in at most one of `due`, `queued`
and `running`, and a job that runs can be found (a restore cancels it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

Key = tuple[str, str]  # (client_id, session_id)


class Schedule:
    """Due times, the queue the workers take from, and the jobs running per key."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        self.due: dict[Key, float] = {}
        self.running: dict[Key, asyncio.Task[Any]] = {}  # compactions and re-compactions
        self.wake = asyncio.Event()

    def busy(self, key: Key) -> bool:
        return key in self.running or key in self.queued

    def enqueue(self, key: Key) -> None:
        if not self.busy(key):
            self.queued.add(key)
            self.queue.put_nowait(key)

    def later(self, key: Key, at: float) -> None:
        """Due at `at` (the scheduler wakes to look again)."""
        self.due[key] = at
        self.wake.set()

    def withdraw(self, key: Key) -> None:
        """Neither queued nor due any more (a worker skips it if it was queued)."""
        self.queued.discard(key)
        self.due.pop(key, None)

    def take(self, key: Key) -> bool:
        """A worker took `key` from the queue: False when it was withdrawn meanwhile."""
        if key not in self.queued:
            return False
        self.queued.discard(key)
        return True

    def take_due(self, now: float) -> list[Key]:
        """The keys whose time has come, no longer due. A job that just failed is still
        running for a moment: its retry waits for it."""
        keys = [key for key, at in self.due.items() if at <= now and key not in self.running]
        for key in keys:
            del self.due[key]
        return keys

    def drop_client(self, client_id: str) -> list[asyncio.Task[Any]]:
        """Forget what is due or queued for the client; its running jobs, to cancel."""
        for key in [k for k in self.due if k[0] == client_id]:
            del self.due[key]
        self.queued -= {k for k in self.queued if k[0] == client_id}
        return [task for key, task in self.running.items() if key[0] == client_id]

    def running_of(self, client_id: str) -> list[str]:
        return sorted(sid for cid, sid in self.running if cid == client_id)

    def queued_of(self, client_id: str) -> int:
        return sum(1 for k in self.queued if k[0] == client_id)

    async def track(self, key: Key, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `work` as this key's job, visible in `running` so a restore can cancel it;
        returns the finished (or cancelled) task."""
        job = asyncio.create_task(work, name=name)
        self.running[key] = job
        try:
            await asyncio.wait([job])
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            if self.running.get(key) is job:
                del self.running[key]
        return job

    async def sleep(self, until: float | None, now: float) -> None:
        """Wait for a wake-up, or until the time `until` (None: no timer)."""
        wait = None if until is None else max(0.0, until - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), wait)


async def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel a job and wait until it has ended (its file step thread may go on: FileGuard)."""
    task.cancel()
    await asyncio.wait([task])
