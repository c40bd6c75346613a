"""Compaction as a service: the `Compactor` summarises ended sessions off the request path.

When a session ends and compaction is enabled, the Compactor queues it; `max_concurrent`
workers run one compaction each (`memd.compaction.job`: the LLM, then the crash-safe file
steps of `memd.compaction.files`), record the outcome (`memd.compaction.store`) and retry
failures with exponential backoff. It also restores a compacted session whose
conversation resumes, and re-compacts on request. See docs/compaction.md.

What it holds per open client (`ClientRecords`: records, ledger, file guard, sqlite thread)
is opened with `open_client` and closed with `close_client` or `close`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from memd.compaction import llm, runs
from memd.compaction.files import StepHook, compacted_ids, restore_files, sweep_tmp
from memd.compaction.job import Outcome
from memd.compaction.schedule import Key, Schedule, cancel
from memd.compaction.status import client_status, compactor_status, session_rows, session_tokens
from memd.compaction.store import STATE_FILE, Backoff, ClientRecords, S
from memd.compaction.usage import day_of
from memd.config import CompactionConfig
from memd.errors import CompactionError
from memd.layout import ClientLayout

if TYPE_CHECKING:
    from memd.sessions import SessionInfo  # sibling service: for types only

log = structlog.get_logger()

CompactedHook = Callable[[str, str], Awaitable[None] | None]
Progress = Callable[[int, int, str], Awaitable[None] | None]
Job = Callable[..., Awaitable[Outcome]]  # compact_session or recompact_session


class Compactor:
    """Runs compactions off the request path: a queue, `max_concurrent` workers, retries.

    Every timing decision is made in `step(now)`; `start()` runs a scheduler that calls it
    when the next retry is due (tests may start without it and call `step` themselves).
    """

    def __init__(
        self,
        config: CompactionConfig,
        *,
        max_concurrent: int = 1,
        timeout: float = llm.DEFAULT_TIMEOUT,
        max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        on_compacted: CompactedHook | None = None,
        step_hook: StepHook | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if max_request_chars < llm.MIN_REQUEST_CHARS:
            raise ValueError(f"max_request_chars must be at least {llm.MIN_REQUEST_CHARS}")
        self.config = config
        self.max_concurrent = max_concurrent
        self.timeout = timeout
        self.max_request_chars = max_request_chars
        self.backoff = backoff or Backoff()
        self.on_compacted = on_compacted
        self._clock = clock
        self._clients: dict[str, ClientRecords] = {}
        self._layouts: dict[str, ClientLayout] = {}  # every client added, open or not yet
        self._schedule = Schedule()
        self._sem = asyncio.Semaphore(max_concurrent)
        self._open_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        # What each run (memd.compaction.runs) uses: these same objects, read-only there;
        # the step hook (memd.compaction.files.StepHook) is only the runs'.
        self.run_parts = runs.RunParts(clock, step_hook, self._clients, self._sem, self._schedule)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, *, schedule: bool = True) -> Compactor:
        # The LLM's SDK is imported (in a thread) at the first call: see llm.warm_up.
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"compaction-worker-{i}")
            for i in range(self.max_concurrent)
        ]
        if schedule:
            self._tasks.append(asyncio.create_task(self._scheduler(), name="compaction-timer"))
        return self

    async def close(self) -> None:
        """Stop everything; interrupted compactions stay pending and resume on next start."""
        jobs = list(self._schedule.running.values())
        for task in [*self._tasks, *jobs]:
            task.cancel()
        await asyncio.gather(*self._tasks, *jobs, return_exceptions=True)
        self._tasks = []
        clients = list(self._clients.values())
        self._clients.clear()  # in place: run_parts holds this dict
        for client in clients:
            await client.close()

    def set_config(self, config: CompactionConfig) -> None:
        """A config reload: the next LLM call uses it; enabling lets due work run."""
        self.config = config
        self._schedule.wake.set()

    def require_enabled(self) -> None:
        """Refuse an explicit request to send a transcript to an LLM the config did not name."""
        if not self.config.enabled:
            raise CompactionError(
                "compaction is disabled: no transcript is sent to an LLM until [compaction] "
                "in memd's config has enabled = true and names llm_provider and llm_model",
                kind="compaction_disabled",
            )

    def settings(self) -> llm.LLMSettings:
        return llm.LLMSettings.from_config(self.config, self.timeout)

    async def add_client(self, layout: ClientLayout) -> None:
        """Know the client; open its state now if compaction is on or it has state on disk.

        A client that never compacted, while compaction is off (the default), keeps no
        database connection and no thread: every enabled client had both, about 140 kB
        each. Its state opens at its first request (submit, restore, recompact).
        """
        self._layouts[layout.client_id] = layout
        if self.config.enabled or (layout.state_dir / STATE_FILE).exists():
            await self.open_client(layout)

    async def open_client(self, layout: ClientLayout) -> None:
        """Load the client's state: finish interrupted restores, queue what was pending."""
        self._layouts[layout.client_id] = layout
        async with self._open_lock:
            if layout.client_id not in self._clients:
                await self._open(layout)

    async def _open(self, layout: ClientLayout) -> None:
        client = await ClientRecords.open(layout)
        try:
            layout.tmp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            await asyncio.to_thread(sweep_tmp, layout, client.guard)
        except BaseException:
            await client.close()
            raise
        self._clients[layout.client_id] = client
        for rec in list(client.records.values()):
            key = (layout.client_id, rec.session_id)
            if rec.state == S.RESTORING:
                await self._restore(client, rec.session_id)
            elif rec.state == S.PENDING:
                self._schedule.later(key, self._clock())
            elif rec.state in (S.FAILED, S.DEFERRED):
                self._schedule.later(key, rec.next_retry or self._clock())
        self._schedule.wake.set()
        log.info("compaction.client_opened", client=layout.client_id, records=len(client.records))

    async def close_client(self, client_id: str) -> None:
        """The client was disabled or removed: stop its work (its state stays on disk)."""
        self._layouts.pop(client_id, None)
        client = self._clients.pop(client_id, None)
        if client is None:
            return
        for job in self._schedule.drop_client(client_id):
            await cancel(job)
        await client.close()

    def files_lock(self, client_id: str) -> threading.Lock:
        """The lock the client's file steps hold, for others who move its files (forget).

        A client this compactor does not have open gets a lock of its own: no step of
        ours runs on its files (`close_client` closed its guard).
        """
        client = self._clients.get(client_id)
        return client.guard.lock if client is not None else threading.Lock()

    def on_end_hook(self, layout: ClientLayout) -> Callable[[SessionInfo], Awaitable[None]]:
        """For ClientSessions(on_end=[...]): compact the session that ended, if enabled.

        Not for a client removed meanwhile (`close_client`): a session that ends while its
        client's sessions close (their queued hooks run then) would otherwise open the
        client's compaction again and send a client the user turned off to the LLM. Its
        session stays ended on disk, and is queued when the client is enabled again."""

        async def on_end(info: SessionInfo) -> None:
            if not self.config.enabled:
                return
            if layout.client_id not in self._layouts:
                log.info(
                    "compaction.not_queued_client_removed",
                    client=layout.client_id,
                    session=info["session_id"],
                )
                return
            await self.submit(layout.client_id, info["session_id"])

        return on_end

    # --- requests -------------------------------------------------------------------------

    async def submit(self, client_id: str, session_id: str, *, force: bool = False) -> bool:
        """Queue a compaction of an *ended* session; False when queued, running or done.

        Without `force` it waits while compaction is disabled; with it (an explicit
        request) it runs now regardless.
        """
        client = await self._opened(client_id)
        client.layout.session_file(session_id)  # refuses ids that are not file names
        key = (client_id, session_id)
        if self._schedule.busy(key):
            return False
        rec = client.get(session_id)
        if (
            rec is not None
            and rec.state == S.COMPACTED
            and not await asyncio.to_thread(client.layout.session_file(session_id).exists)
        ):
            return False  # done, and not restored since
        attempts = rec.attempts if rec and rec.state in (S.PENDING, S.FAILED, S.DEFERRED) else 0
        self._set(client, session_id, S.PENDING, attempts=attempts, next_retry=None)
        self._schedule.withdraw(key)
        if force or self.config.enabled:
            self._schedule.enqueue(key)
        else:
            self._schedule.later(key, self._clock())
        return True

    async def restore(self, client_id: str, session_id: str) -> str:
        """Bring a compacted session's transcript back into sessions/ and drop its summary.

        For a conversation that resumes. Cancels a compaction or re-compaction of it that
        is in flight, and resets its state, so it is compacted again when it ends
        (submit). A file step of the cancelled job whose thread already started finds
        its restore token out of date and does nothing, so once this returns the
        transcript is in sessions/ and stays there. Returns "restored", or "missing"
        when no transcript exists any more.
        """
        client = await self._opened(client_id)
        client.layout.session_file(session_id)
        key = (client_id, session_id)
        if key in self._schedule.running:
            await cancel(self._schedule.running[key])
        self._schedule.withdraw(key)
        return await self._restore(client, session_id)

    async def recompact(
        self, client_id: str, session_id: str | None = None, *, on_progress: Progress | None = None
    ) -> list[dict[str, Any]]:
        """Summarise again from archive/ one compacted session, or all of them (None).

        Runs within the same concurrency bound as compactions; failures are reported per
        session (and shown as `last_error`), the old summary stays in place. Refused while
        compaction is disabled.
        """
        self.require_enabled()
        client = await self._opened(client_id)
        targets = (
            [session_id] if session_id else await asyncio.to_thread(compacted_ids, client.layout)
        )
        results: list[dict[str, Any]] = []
        for done, sid in enumerate(targets, 1):
            results.append(await self._recompact_one(client, sid))
            if on_progress is not None:
                await runs.maybe_await(on_progress(done, len(targets), sid))
        return results

    # --- inspection -----------------------------------------------------------------------

    def sessions(self, client_id: str) -> dict[str, dict[str, Any]]:
        """Per-session compaction state for sessions.list (sessions never submitted are absent)."""
        client = self._clients.get(client_id)
        if client is None:
            return {}
        running = set(self._schedule.running_of(client_id))
        return session_rows(client, running, day_of(self._clock()))

    def session_tokens(self, client_id: str) -> dict[str, dict[str, Any]]:
        """Tokens per session that spent any, also restored ones that have no state row."""
        client = self._clients.get(client_id)
        return session_tokens(client, day_of(self._clock())) if client is not None else {}

    def client_status(self, client_id: str) -> dict[str, Any]:
        """Counts per state, what runs, and every failure with its next retry."""
        client = self._clients.get(client_id)
        if client is None:
            return {}
        ledgers = [c.ledger for c in self._clients.values()]
        return client_status(client, self._schedule, self.config, ledgers, self._clock())

    def status(self) -> dict[str, Any]:
        out = compactor_status(self.config, self._schedule, self._clients, self._clock())
        out["llm_model"] = self.settings().model
        out["max_concurrent"] = self.max_concurrent
        out["clients"] = {cid: self.client_status(cid) for cid in sorted(self._clients)}
        return out

    # --- scheduling -----------------------------------------------------------------------

    def step(self, now: float | None = None) -> int:
        """Queue every compaction whose time has come; returns how many were queued."""
        if not self.config.enabled:
            return 0
        due = self._schedule.take_due(self._clock() if now is None else now)
        for key in due:
            client = self._clients[key[0]]
            rec = client.get(key[1])
            if rec is not None and rec.state in (S.FAILED, S.DEFERRED):  # its time has come
                self._set(client, key[1], S.PENDING, next_retry=None)
            self._schedule.enqueue(key)
        return len(due)

    async def drain(self) -> None:
        """Wait until nothing is queued or running (retries scheduled later don't count)
        and what they recorded is written."""
        await self._schedule.queue.join()
        for client in list(self._clients.values()):
            await client.flush()

    async def _scheduler(self) -> None:
        due = self._schedule.due
        while True:
            self._schedule.wake.clear()
            self.step()
            until = min(due.values()) if self.config.enabled and due else None
            await self._schedule.sleep(until, self._clock())

    async def _worker(self) -> None:
        while True:
            key = await self._schedule.queue.get()
            try:
                if not self._schedule.take(key):
                    continue  # withdrawn (restore, client closed) while it waited
                job = await self._schedule.track(key, self._compact(key), f"compaction:{key[1]}")
                if not job.cancelled() and job.exception() is not None:
                    log.error(
                        "compaction.crashed",
                        client=key[0],
                        session=key[1],
                        error=repr(job.exception()),
                    )
            finally:
                self._schedule.queue.task_done()

    # --- one run (memd.compaction.runs) --------------------------------------------------

    async def _compact(self, key: Key) -> None:
        await runs.compact(self, key)

    async def _recompact_one(self, client: ClientRecords, sid: str) -> dict[str, Any]:
        return await runs.recompact_one(self, client, sid)

    async def _restore(self, client: ClientRecords, sid: str) -> str:
        self._set(client, sid, S.RESTORING)
        await client.flush()  # the intent is on disk before any file moves
        result = await asyncio.to_thread(restore_files, client.layout, sid, client.guard)
        self._set(client, sid, None)
        await client.flush()
        log.info("compaction.restored", client=client.layout.client_id, session=sid, result=result)
        return result

    # --- state ----------------------------------------------------------------------------

    async def _opened(self, client_id: str) -> ClientRecords:
        """The client's state, opened now if it was added and not opened yet."""
        if client_id not in self._clients and client_id in self._layouts:
            await self.open_client(self._layouts[client_id])
        client = self._clients.get(client_id)
        if client is None:
            raise KeyError(f"compaction is not open for client {client_id!r}")
        return client

    def _set(self, client: ClientRecords, sid: str, state: str | None, **changes: Any) -> None:
        """Every state change goes through ClientRecords.set, stamped with our clock."""
        client.set(sid, state, self._clock(), **changes)
