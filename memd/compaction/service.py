"""Compaction as a service: the `Compactor` summarises ended sessions off the request path.

When a session ends and compaction is enabled, the Compactor queues it; `max_concurrent`
workers run one compaction each (`memd.compaction.job`: the LLM, then the crash-safe file
steps of `memd.compaction.files`), record the outcome (`memd.compaction.store`) and retry
failures with exponential backoff. It also restores a compacted session whose
conversation resumes, and re-compacts on request. See docs/compaction.md.

The names other modules use are re-exported here, so `memd.compaction.service` stays the one
import for compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from memd.compaction import llm
from memd.compaction.files import (
    StepHook,
    Superseded,
    TranscriptChanged,
    compacted_ids,
    restore_files,
    summary_meta,
    sweep_tmp,
)
from memd.compaction.job import Outcome, compact_session, recompact_session, restore
from memd.compaction.status import client_cap, session_rows, session_tokens, total_cap
from memd.compaction.store import (
    Backoff,
    ClientRecords,
    CompactionStates,
    Record,
    S,
    Store,
)
from memd.compaction.usage import Usage, cap_reached, day_of, next_day, summary_of
from memd.config import CompactionConfig
from memd.errors import CompactionError
from memd.layout import ClientLayout
from memd.markdown import (
    iso,
    parse_summary_title,
    read_front_matter,
    render_summary,
    shape_body,
)

log = structlog.get_logger()

CompactedHook = Callable[[str, str], Awaitable[None] | None]
Progress = Callable[[int, int, str], Awaitable[None] | None]

Key = tuple[str, str]  # (client_id, session_id)


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
        self._step_hook = step_hook  # see compaction_files.StepHook
        self._clock = clock
        self._clients: dict[str, ClientRecords] = {}
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._due: dict[Key, float] = {}
        self._running: dict[Key, asyncio.Task[Any]] = {}  # compactions and re-compactions
        self._sem = asyncio.Semaphore(max_concurrent)
        self._wake = asyncio.Event()
        self._open_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, *, schedule: bool = True) -> Compactor:
        await llm.warm_up(self.config.llm_provider)
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"compaction-worker-{i}")
            for i in range(self.max_concurrent)
        ]
        if schedule:
            self._tasks.append(asyncio.create_task(self._scheduler(), name="compaction-timer"))
        return self

    async def close(self) -> None:
        """Stop everything; interrupted compactions stay pending and resume on next start."""
        jobs = list(self._running.values())
        for task in [*self._tasks, *jobs]:
            task.cancel()
        await asyncio.gather(*self._tasks, *jobs, return_exceptions=True)
        self._tasks = []
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def set_config(self, config: CompactionConfig) -> None:
        """A config reload: the next LLM call uses it; enabling lets due work run."""
        self.config = config
        self._wake.set()

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

    async def open_client(self, layout: ClientLayout) -> None:
        """Load the client's state: finish interrupted restores, queue what was pending."""
        async with self._open_lock:
            if layout.client_id not in self._clients:
                await self._open(layout)

    async def _open(self, layout: ClientLayout) -> None:
        client = await asyncio.to_thread(ClientRecords.open, layout)
        layout.tmp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        await asyncio.to_thread(sweep_tmp, layout)
        self._clients[layout.client_id] = client
        for rec in list(client.records.values()):
            key = (layout.client_id, rec.session_id)
            if rec.state == S.RESTORING:
                await self._restore(client, rec.session_id)
            elif rec.state == S.PENDING:
                self._due[key] = self._clock()
            elif rec.state in (S.FAILED, S.DEFERRED):
                self._due[key] = rec.next_retry or self._clock()
        self._wake.set()
        log.info("compaction.client_opened", client=layout.client_id, records=len(client.records))

    async def close_client(self, client_id: str) -> None:
        """The client was disabled or removed: stop its work (its state stays on disk)."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return
        for key in [k for k in self._running if k[0] == client_id]:
            await _cancel(self._running[key])
        for key in [k for k in self._due if k[0] == client_id]:
            del self._due[key]
        self._queued -= {k for k in self._queued if k[0] == client_id}
        client.close()

    def on_end_hook(self, layout: ClientLayout) -> Callable[[dict[str, Any]], Awaitable[None]]:
        """For ClientSessions(on_end=[...]): compact the session that ended, if enabled."""

        async def on_end(info: dict[str, Any]) -> None:
            if self.config.enabled:
                await self.open_client(layout)
                await self.submit(layout.client_id, info["session_id"])

        return on_end

    # --- requests -------------------------------------------------------------------------

    async def submit(self, client_id: str, session_id: str, *, force: bool = False) -> bool:
        """Queue a compaction of an *ended* session; False when queued, running or done.

        Without `force` it waits while compaction is disabled; with it (an explicit
        request) it runs now regardless.
        """
        client = self._client(client_id)
        client.layout.session_file(session_id)  # refuses ids that are not file names
        key = (client_id, session_id)
        if key in self._running or key in self._queued:
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
        self._due.pop(key, None)
        if force or self.config.enabled:
            self._enqueue(key)
        else:
            self._due[key] = self._clock()
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
        client = self._client(client_id)
        client.layout.session_file(session_id)
        key = (client_id, session_id)
        if key in self._running:
            await _cancel(self._running[key])
        self._queued.discard(key)
        self._due.pop(key, None)
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
        client = self._client(client_id)
        targets = (
            [session_id] if session_id else await asyncio.to_thread(compacted_ids, client.layout)
        )
        results: list[dict[str, Any]] = []
        for done, sid in enumerate(targets, 1):
            results.append(await self._recompact_one(client, sid))
            if on_progress is not None:
                await _maybe_await(on_progress(done, len(targets), sid))
        return results

    # --- inspection -----------------------------------------------------------------------

    def sessions(self, client_id: str) -> dict[str, dict[str, Any]]:
        """Per-session compaction state for sessions.list (sessions never submitted are absent)."""
        client = self._clients.get(client_id)
        if client is None:
            return {}
        running = {sid for cid, sid in self._running if cid == client_id}
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
        counts = client.counts()
        failures = [
            rec.public(client.layout) for rec in client.records.values() if rec.state == S.FAILED
        ]
        day = day_of(self._clock())
        return {
            **counts,
            "running": sorted(k[1] for k in self._running if k[0] == client_id),
            "queued": sum(1 for k in self._queued if k[0] == client_id),
            "failures": failures,
            "tokens": client.ledger.summary(day),
            "cap": client_cap(
                self.config,
                client.ledger,
                [c.ledger for c in self._clients.values()],
                day,
                self._clock(),
            ),
        }

    def status(self) -> dict[str, Any]:
        cfg = self.config
        now = self._clock()
        day = day_of(now)
        return {
            "enabled": cfg.enabled,
            "llm_provider": cfg.llm_provider,
            "llm_model": self.settings().model,
            "max_concurrent": self.max_concurrent,
            "queued": len(self._queued),
            "running": len(self._running),
            "scheduled": len(self._due),
            "deferred": sum(c.counts()[S.DEFERRED] for c in self._clients.values()),
            "tokens": summary_of((c.ledger for c in self._clients.values()), day),
            "cap": total_cap(cfg, [c.ledger for c in self._clients.values()], day, now),
            "clients": {cid: self.client_status(cid) for cid in sorted(self._clients)},
        }

    # --- scheduling -----------------------------------------------------------------------

    def step(self, now: float | None = None) -> int:
        """Queue every compaction whose time has come; returns how many were queued."""
        if not self.config.enabled:
            return 0
        now = self._clock() if now is None else now
        # A job that just failed is still running for a moment: its retry waits for it.
        due = [key for key, at in self._due.items() if at <= now and key not in self._running]
        for key in due:
            del self._due[key]
            client = self._clients[key[0]]
            rec = client.get(key[1])
            if rec is not None and rec.state in (S.FAILED, S.DEFERRED):  # its time has come
                self._set(client, key[1], S.PENDING, next_retry=None)
            self._enqueue(key)
        return len(due)

    async def drain(self) -> None:
        """Wait until nothing is queued or running (retries scheduled later don't count)."""
        await self._queue.join()

    async def _tracked(
        self, key: Key, work: Coroutine[Any, Any, Any], name: str
    ) -> asyncio.Task[Any]:
        """Run `work` as this session's job, visible in `_running` so a restore can cancel
        it; returns the finished (or cancelled) task."""
        job = asyncio.create_task(work, name=name)
        self._running[key] = job
        try:
            await asyncio.wait([job])
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            if self._running.get(key) is job:
                del self._running[key]
        return job

    def _enqueue(self, key: Key) -> None:
        if key not in self._queued and key not in self._running:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def _scheduler(self) -> None:
        while True:
            self._wake.clear()
            self.step()
            wait = None
            if self.config.enabled and self._due:
                wait = max(0.0, min(self._due.values()) - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                if key not in self._queued:
                    continue  # withdrawn (restore, client closed) while it waited
                self._queued.discard(key)
                job = await self._tracked(key, self._compact(key), f"compaction:{key[1]}")
                if not job.cancelled() and job.exception() is not None:
                    log.error(
                        "compaction.crashed",
                        client=key[0],
                        session=key[1],
                        error=repr(job.exception()),
                    )
            finally:
                self._queue.task_done()

    async def _compact(self, key: Key) -> None:
        client_id, sid = key
        client = self._clients.get(client_id)
        rec = client.get(sid) if client is not None else None
        if client is None or rec is None or rec.state != S.PENDING:
            return  # restored, or the client closed, while it waited
        async with self._sem:
            if (reason := self._cap_reached(client)) is not None:
                self._defer(client, sid, reason)
                return
            settings = self.settings()
            usage = Usage()
            try:
                out = await compact_session(
                    client.layout,
                    sid,
                    settings,
                    max_request_chars=self.max_request_chars,
                    clock=self._clock,
                    step_hook=self._step_hook,
                    usage=usage,
                )
            except Exception as exc:  # whatever it was, nothing half-done is left: retry later
                self._fail(client, sid, exc)
                return
            finally:  # what was spent counts, also for a failed or cancelled compaction
                self._spend(client, sid, usage)
        if out.result == "missing":
            self._set(client, sid, S.MISSING, last_error="no transcript in sessions/ or archive/")
            return
        self._set(
            client,
            sid,
            S.COMPACTED,
            last_error=None,
            next_retry=None,
            compacted_at=out.compacted_at or self._clock(),
            llm_provider=out.llm_provider or settings.provider,
            llm_model=out.llm_model or settings.model,
            parts=out.parts,
            requests=out.requests,
        )
        if self.on_compacted is not None:
            try:
                await _maybe_await(self.on_compacted(client_id, sid))
            except Exception:
                log.exception("compaction.hook_failed", client=client_id, session=sid)

    def _fail(self, client: ClientRecords, sid: str, exc: Exception) -> None:
        rec = client.records[sid]
        attempts = rec.attempts + 1
        delay = self.backoff.delay(attempts)
        retry_at = self._clock() + delay
        error = f"{getattr(exc, 'reason', type(exc).__name__)}: {exc}"
        self._set(client, sid, S.FAILED, attempts=attempts, last_error=error, next_retry=retry_at)
        self._due[(client.layout.client_id, sid)] = retry_at
        self._wake.set()
        log.warning(
            "compaction.failed",
            client=client.layout.client_id,
            session=sid,
            attempts=attempts,
            retry_in=round(delay, 3),
            error=error,
        )

    def _cap_reached(self, client: ClientRecords) -> str | None:
        cfg = self.config
        return cap_reached(
            cfg.max_input_tokens_per_day_per_client,
            cfg.max_input_tokens_per_day,
            client.ledger,
            [c.ledger for c in self._clients.values()],
            day_of(self._clock()),
        )

    def _defer(self, client: ClientRecords, sid: str, reason: str) -> None:
        """At a cap: wait, untouched and searchable, until the next UTC day starts."""
        at = next_day(self._clock())
        self._set(client, sid, S.DEFERRED, last_error=f"deferred: {reason}", next_retry=at)
        self._due[(client.layout.client_id, sid)] = at
        self._wake.set()
        log.info(
            "compaction.deferred",
            client=client.layout.client_id,
            session=sid,
            reason=reason,
            until=iso(at),
        )

    def _spend(self, client: ClientRecords, sid: str, usage: Usage) -> None:
        if usage:
            client.ledger.add(sid, day_of(self._clock()), usage)

    async def _recompact_one(self, client: ClientRecords, sid: str) -> dict[str, Any]:
        """One re-compaction, tracked as running so a restore of the session cancels it."""
        client.layout.session_file(sid)
        key = (client.layout.client_id, sid)
        if key in self._running or key in self._queued:
            return {"session_id": sid, "result": "busy", "error": "a compaction is running"}
        job = await self._tracked(key, self._recompact(client, sid), f"recompaction:{sid}")
        if job.cancelled():
            return {
                "session_id": sid,
                "result": "cancelled",
                "error": "the session was restored or compaction stopped",
            }
        return job.result()

    async def _recompact(self, client: ClientRecords, sid: str) -> dict[str, Any]:
        async with self._sem:
            if (reason := self._cap_reached(client)) is not None:
                resets = iso(next_day(self._clock()))
                error = f"deferred: {reason}; ask again after {resets}"
                return {"session_id": sid, "result": "deferred", "error": error}
            settings = self.settings()
            usage = Usage()
            try:
                out = await recompact_session(
                    client.layout,
                    sid,
                    settings,
                    max_request_chars=self.max_request_chars,
                    clock=self._clock,
                    step_hook=self._step_hook,
                    usage=usage,
                )
            except Exception as exc:
                error = f"{getattr(exc, 'reason', type(exc).__name__)}: {exc}"
                rec = client.get(sid)
                if rec is not None and rec.state == S.COMPACTED:
                    self._set(client, sid, S.COMPACTED, last_error=error)
                log.warning(
                    "compaction.recompact_failed",
                    client=client.layout.client_id,
                    session=sid,
                    error=error,
                )
                return {"session_id": sid, "result": "failed", "error": error}
            finally:
                self._spend(client, sid, usage)
        if out.result == "recompacted":
            self._set(
                client,
                sid,
                S.COMPACTED,
                last_error=None,
                next_retry=None,
                compacted_at=out.compacted_at,
                llm_provider=out.llm_provider,
                llm_model=out.llm_model,
                parts=out.parts,
                requests=out.requests,
            )
        return {"session_id": sid, "result": out.result, "error": None}

    async def _restore(self, client: ClientRecords, sid: str) -> str:
        self._set(client, sid, S.RESTORING)
        result = await asyncio.to_thread(restore_files, client.layout, sid)
        self._set(client, sid, None)
        log.info("compaction.restored", client=client.layout.client_id, session=sid, result=result)
        return result

    # --- state ----------------------------------------------------------------------------

    def _client(self, client_id: str) -> ClientRecords:
        client = self._clients.get(client_id)
        if client is None:
            raise KeyError(f"compaction is not open for client {client_id!r}")
        return client

    def _set(self, client: ClientRecords, sid: str, state: str | None, **changes: Any) -> None:
        """Every state change goes through ClientRecords.set, stamped with our clock."""
        client.set(sid, state, self._clock(), **changes)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.wait([task])


async def _maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


__all__ = [
    "Backoff",
    "CompactionStates",
    "Compactor",
    "Outcome",
    "Record",
    "Store",
    "Superseded",
    "TranscriptChanged",
    "compact_session",
    "parse_summary_title",
    "read_front_matter",
    "recompact_session",
    "render_summary",
    "restore",
    "restore_files",
    "shape_body",
    "summary_meta",
]
