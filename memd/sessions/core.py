"""One client's decision state: what ClientSessions, its Recorder and its Importer share.

The book (memd.sessions.book), the store and the group-commit writer, the decision lock,
the reload after a failed write and the worker thread for big requests live here, in one
object the three are handed: the recorder and the importer are parts of ClientSessions by
composition, each with this one typed dependency, not mixins that redeclare its
attributes. The rules of decisions, reloads and rewrites are in memd.sessions.tracker's
module doc.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog

from memd.errors import Busy, StorageError
from memd.layout import ClientLayout
from memd.redaction import Scrubber
from memd.sessions.book import Op, SessionBook
from memd.sessions.committer import Committer
from memd.sessions.events import EventKind, Hook
from memd.sessions.store import Change, StateStore

log = structlog.get_logger()

T = TypeVar("T")
RETRY_AFTER = 1.0  # seconds: the hint a record refused during a rewrite gets


class Stale(Exception):
    """The state was voided (a failed write reloads it) while a decision was in a thread."""


class SessionCore:
    """One client's state, lock, writer and threads (see the module doc)."""

    def __init__(
        self,
        layout: ClientLayout,
        *,
        clock: Callable[[], float],
        hooks: Callable[[EventKind], Sequence[Hook]],
        index_capacity: int,
        scrubber: Scrubber,
    ) -> None:
        self.layout = layout
        self.client_id = layout.client_id
        self.scrubber = scrubber  # the daemon's, from [privacy]; set on reload
        self.seal_key = b""  # the client's hash key, read with the state
        self.index_capacity = index_capacity  # nodes, and exchange keys, kept in memory
        self.index_chars: int | None = None
        self.inactivity = self.max_duration = 0.0  # seconds; ClientSessions sets them
        self.clock = clock
        self.book = SessionBook(layout)
        self.disk = StateStore(layout)
        self.committer = Committer(self.disk, self.client_id, hooks, self.after_failure)
        self.deciding = asyncio.Lock()  # held while a call decides and queues its change
        self.generation = 0  # counts reloads: a decision spanning one decides again
        self.rewriting = 0  # record calls get `busy` while > 0 (memd.sessions.recording)
        self.ready = asyncio.Event()
        # Set when reloading the state after a failed write failed too (disk read-only,
        # full): calls fail fast with StorageError and the next call tries the reload again.
        self.broken: Exception | None = None
        self._reload_lock = asyncio.Lock()
        # This client's own worker thread (started by open(), stopped by close()): the
        # loop's default executor also runs recall searches, which can all be stuck on a
        # hung index server for their whole timeout.
        self.hashing: ThreadPoolExecutor | None = None

    def set_limits(self, inactivity: float, max_duration: float, index_chars: int | None) -> None:
        """Session timeouts in seconds and the indexing bound, for the next check or write."""
        self.inactivity, self.max_duration, self.index_chars = inactivity, max_duration, index_chars
        self.book.inactivity, self.book.max_duration = inactivity, max_duration

    def enqueue(self, op: Op, *, wait_hooks: bool = False) -> Awaitable[None]:
        """Queue the op's change (in decision order); await: it is on disk (and hooks ran)."""
        book = self.book
        return self.committer.enqueue(
            book.change(op), op.events, wait_hooks=wait_hooks, on_commit=partial(book.saved, op)
        )

    def refuse_while_rewriting(self) -> None:
        """Fail fast with `busy` while a rewrite holds or awaits the decision lock."""
        if self.rewriting:
            raise Busy(
                f"memd is forgetting from the memory of client {self.client_id!r}; nothing "
                f"was recorded, retry in {RETRY_AFTER:g} s",
                data={"retry_after": RETRY_AFTER, "client_id": self.client_id},
            )

    async def paused(self, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """Run `fn` in the IO thread with the state closed; record calls arriving
        meanwhile get `busy` rather than wait (calls already queued for the lock go first)."""
        self.rewriting += 1
        try:
            async with self.deciding:
                await self.wait_ready()
                self.ready.clear()
                try:
                    await self.committer.submit(Change(), [])  # barrier: decided is on disk
                    return await self.committer.io(fn, *args) if fn is not None else None
                finally:
                    await self.committer.io(self.disk.close)
                    await self.reload()
        finally:
            self.rewriting -= 1

    # --- worker thread -------------------------------------------------------------------

    async def cpu(self, big: bool, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in this client's worker thread when the input is big, else here."""
        if not big or self.hashing is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.hashing, fn, *args)

    async def cpu_fresh(self, generation: int, big: bool, fn: Callable[..., T], *args: Any) -> T:
        """`cpu` within a decision: raises Stale if the state was voided meanwhile."""
        try:
            result = await self.cpu(big, fn, *args)
        except Exception:
            if self.stale(generation):
                raise Stale from None  # e.g. the old index's reader was closed under it
            raise
        if self.stale(generation):
            raise Stale
        return result

    def stale(self, generation: int) -> bool:
        return generation != self.generation or not self.ready.is_set()

    # --- reloads -------------------------------------------------------------------------

    async def after_failure(self, exc: Exception) -> None:
        """A write failed: what was decided is void; rebuild memory from the committed state.

        If that fails too, the store is marked broken instead of staying unready: calls
        then fail fast (and retry the reload) rather than wait for ever.
        """
        self.ready.clear()
        self.generation += 1  # a decision in a thread now decides again
        await self.committer.io(self.disk.close)
        try:
            await self.reload()
        except Exception as reload_exc:
            self.broken = reload_exc
            self.ready.set()  # waiters wake up and see the broken store
            raise

    async def reload(self) -> None:
        self.ready.clear()
        self.generation += 1
        loaded = await self.committer.io(self.disk.open)
        book = SessionBook(self.layout)
        book.inactivity, book.max_duration = self.inactivity, self.max_duration
        book.load(loaded, self.index_capacity)
        self.book = book
        self.seal_key = self.disk.seal_key
        self.ready.set()

    async def wait_ready(self) -> None:
        if not self.committer.running:
            raise StorageError("session store is not open")
        await self.ready.wait()
        if self.broken is not None:
            await self._retry_reload()

    async def _retry_reload(self) -> None:
        """One caller at a time tries to reopen the state; the others get its verdict."""
        async with self._reload_lock:
            if self.broken is None:
                return
            try:
                # Touch the database only once the disk takes writes again: reopening
                # sqlite over and over on a failing filesystem gains nothing.
                await self.committer.io(_probe_writable, self.layout.tmp_dir)
                await self.committer.io(self.disk.close)
                await self.reload()
            except Exception as exc:
                self.broken = exc
                self.ready.set()
                raise StorageError(
                    f"could not record: the session store cannot be reopened: {exc}"
                ) from exc
            self.broken = None
            log.info("sessions.store_reopened", client=self.client_id)


def _probe_writable(folder: Path) -> None:
    """Create, fsync and remove a small file: raises OSError while the disk refuses writes."""
    fd, name = tempfile.mkstemp(dir=folder, prefix="probe.", suffix=".tmp")
    try:
        os.write(fd, b"memd")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(name)
