"""Group commit: record calls' decided changes written in batches on one IO thread.

`Committer` takes what record calls decided on the event loop and writes it in one
batch per round: everything queued while the previous batch was syncing goes next, and
callers are answered only once their batch is on disk. Session events (end, resume) go
to their hooks after the commit, in order, off the writer's path. The store it commits
through (`memd.sessions.store.StateStore`) documents the on-disk contract and recovery.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog

from memd.errors import StorageError
from memd.sessions.events import EventKind, Hook, SessionEvent
from memd.sessions.store import Change, StateStore

log = structlog.get_logger()

# Seconds without a commit after which the client's sqlite connections give their page
# caches back (StateStore.shrink): up to 2 x CACHE_KIB a client, filled by a burst of
# records and of no use to a client at rest.
SHRINK_AFTER = 60.0


@dataclass
class _Pending:
    change: Change
    events: list[SessionEvent]
    future: asyncio.Future[None]
    hooks_done: asyncio.Future[None] | None
    on_commit: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class _HooksDone:
    """Every hook queued before this message has run: resolve the future."""

    future: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class _Stop:
    """The hook runner's last message (close)."""


_HookMessage = SessionEvent | _HooksDone | _Stop


class Committer:
    """Group commit of one client's changes onto its IO thread, then the event hooks.

    `hooks(kind)` names the hooks for an event kind at the time it runs (the lists may
    change while the daemon runs). After a failed commit every decided change fails
    with StorageError and `on_failure` rebuilds the caller's memory from the state.
    Once no commit has come for `SHRINK_AFTER` seconds, the store gives its sqlite page
    caches back (issue 29: ~3 MB of memd 150 s after five minutes of bench/load.py).
    """

    def __init__(
        self,
        store: StateStore,
        client_id: str,
        hooks: Callable[[EventKind], Sequence[Hook]],
        on_failure: Callable[[Exception], Awaitable[None]],
    ) -> None:
        self.store = store
        self._shrink_after = SHRINK_AFTER
        self.client_id = client_id
        self._hooks = hooks
        self._on_failure = on_failure
        self._executor: ThreadPoolExecutor | None = None
        self._queue: list[_Pending] = []
        self._writing = 0  # changes in the batch being committed
        self._wake = asyncio.Event()
        self._closing = False
        self._hook_queue: asyncio.Queue[_HookMessage] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def unsaved(self) -> int:
        """Changes queued and not yet on disk (queued, or in the batch being written)."""
        return len(self._queue) + self._writing

    @property
    def running(self) -> bool:
        return self._executor is not None

    def start(self) -> None:
        self._closing = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"memd-{self.client_id}")
        self._tasks = [
            asyncio.create_task(self._writer(), name=f"writer:{self.client_id}"),
            asyncio.create_task(self._hook_runner(), name=f"hooks:{self.client_id}"),
        ]

    async def close(self) -> None:
        """Finish queued writes and hooks, then release files and the database."""
        if self._executor is None:
            return
        self._closing = True
        self._wake.set()
        await self._tasks[0]
        await self._hook_queue.put(_Stop())
        await self._tasks[1]
        await self.io(self.store.close)
        self._executor.shutdown()
        self._executor = None

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(
        self, change: Change, events: list[SessionEvent], *, wait_hooks: bool = False
    ) -> None:
        """Queue a change and wait until it is on disk (and, with wait_hooks, its hooks ran).

        An empty change with wait_hooks is a barrier: everything queued before it is
        committed and every hook of it has run.
        """
        await self.enqueue(change, events, wait_hooks=wait_hooks)

    def enqueue(
        self,
        change: Change,
        events: list[SessionEvent],
        *,
        wait_hooks: bool = False,
        on_commit: Callable[[], None] | None = None,
    ) -> Awaitable[None]:
        """Queue a change now (changes commit in the order they are queued); the result
        resolves as `submit` returns. Lets a caller queue under its lock and wait after.
        `on_commit` runs on the event loop once the change is on disk, whether or not
        anybody still awaits the result (not when the commit fails)."""
        if self._closing or self._executor is None:
            raise StorageError("session store is closed")
        loop = asyncio.get_running_loop()
        item = _Pending(
            change,
            events,
            loop.create_future(),
            loop.create_future() if wait_hooks else None,
            on_commit,
        )
        self._queue.append(item)
        self._wake.set()
        return _settled(item)

    async def _writer(self) -> None:
        rested = True  # nothing committed since the caches were last given back
        while True:
            if not await self._woken(None if rested else self._shrink_after):
                await self.io(self.store.shrink)
                rested = True
                continue
            self._wake.clear()
            if not self._queue:
                if self._closing:
                    return
                continue
            batch, self._queue = self._queue, []
            self._writing = len(batch)
            try:
                await self.io(self.store.commit, [item.change for item in batch])
            except Exception as exc:
                self._writing = 0
                await self._fail(batch, exc)
                continue
            self._writing = 0
            rested = False
            for item in batch:
                if item.on_commit is not None:
                    item.on_commit()
                for event in item.events:
                    self._hook_queue.put_nowait(event)
                if item.hooks_done is not None:
                    self._hook_queue.put_nowait(_HooksDone(item.hooks_done))
                _resolve(item.future)
            if self._queue or self._closing:
                self._wake.set()

    async def _woken(self, timeout: float | None) -> bool:
        """Whether `_wake` was set within `timeout` (None: however long it takes)."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _fail(self, batch: list[_Pending], exc: Exception) -> None:
        """A failed write: fail every decided change, then let the owner reload the state."""
        failed, self._queue = batch + self._queue, []
        log.error(
            "sessions.record_failed",
            client=self.client_id,
            error=str(exc),
            ops=len(failed),
            exc_info=exc,
        )  # the traceback: a failure here is rare and must be findable
        for item in failed:
            _resolve(item.future, StorageError(f"could not record: {exc}"))
            _resolve(item.hooks_done)
        try:
            await self._on_failure(exc)
        except Exception as reload_exc:  # the store stays unready; calls wait for a restart
            log.error("sessions.reload_failed", client=self.client_id, error=str(reload_exc))

    async def _hook_runner(self) -> None:
        """Runs hooks in event order; a failing hook is only logged."""
        while True:
            message = await self._hook_queue.get()
            if isinstance(message, _Stop):
                return
            if isinstance(message, _HooksDone):
                _resolve(message.future)
                continue
            for hook in self._hooks(message.kind):
                try:
                    await maybe_await(hook(message.info))
                except Exception:
                    log.exception(
                        "session.hook_failed",
                        client=self.client_id,
                        hook_event=message.kind,
                        hook=getattr(hook, "__qualname__", repr(hook)),
                    )


async def _settled(item: _Pending) -> None:
    await asyncio.shield(item.future)
    if item.hooks_done is not None:
        await asyncio.shield(item.hooks_done)


async def maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


def _resolve(future: asyncio.Future[None] | None, exc: BaseException | None = None) -> None:
    if future is None or future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
        future.add_done_callback(lambda f: f.exception())  # nobody may be waiting any more
