"""One compaction or re-compaction run of the `Compactor` (memd.compaction.service).

The job (memd.compaction.job) under the compactor's concurrency bound and daily token
caps, with the settings in force when it starts, and its outcome recorded
(memd.compaction.outcomes). The compactor decides *when* a run happens (its queue,
workers and retries); these functions are what one run does, kept apart for size. They
use the compactor's public face, and the parts it shares with its runs (`RunParts`: its
clock, concurrency bound, schedule and open clients) as `Compactor.run_parts`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from memd.compaction import outcomes
from memd.compaction.files import StepHook
from memd.compaction.job import Outcome, compact_session, recompact_session
from memd.compaction.schedule import Key, Schedule
from memd.compaction.store import ClientRecords, S
from memd.compaction.usage import Usage, cap_reached, day_of, next_day
from memd.markdown import iso

if TYPE_CHECKING:
    from memd.compaction.service import Compactor, Job

log = structlog.get_logger()


@dataclass(frozen=True)
class RunParts:
    """What the Compactor shares with each run: the same objects it uses itself, handed
    over once so that a run reads none of its private state."""

    clock: Callable[[], float]
    step_hook: StepHook | None  # see memd.compaction.files.StepHook
    clients: Mapping[str, ClientRecords]  # the open clients (the Compactor's own dict)
    bound: asyncio.Semaphore  # max_concurrent: every run holds it while it works
    schedule: Schedule


async def _run(compactor: Compactor, job: Job, client: ClientRecords, sid: str) -> Outcome:
    """One compaction or re-compaction with the settings in force now; what it spent
    counts, also for one that fails or is cancelled."""
    parts = compactor.run_parts
    usage = Usage()
    try:
        return await job(
            client.layout,
            sid,
            compactor.settings(),
            max_request_chars=compactor.max_request_chars,
            clock=parts.clock,
            step_hook=parts.step_hook,
            usage=usage,
            guard=client.guard,
        )
    finally:
        if usage:
            client.ledger.add(sid, day_of(parts.clock()), usage)


async def compact(compactor: Compactor, key: Key) -> None:
    parts = compactor.run_parts
    client_id, sid = key
    client = parts.clients.get(client_id)
    rec = client.get(sid) if client is not None else None
    if client is None or rec is None or rec.state != S.PENDING:
        return  # restored, or the client closed, while it waited
    async with parts.bound:
        if (reason := _cap_reached(compactor, client)) is not None:
            outcomes.deferred(client, parts.schedule, sid, reason, parts.clock())
            return
        settings = compactor.settings()
        try:
            out = await _run(compactor, compact_session, client, sid)
        except Exception as exc:  # whatever it was, nothing half-done is left: retry later
            outcomes.failed(client, parts.schedule, sid, exc, compactor.backoff, parts.clock())
            return
    if out.result == "missing":
        error = "no transcript in sessions/ or archive/"
        client.set(sid, S.MISSING, parts.clock(), last_error=error)
        return
    outcomes.compacted(client, sid, out, settings, parts.clock())
    if compactor.on_compacted is not None:
        try:
            await maybe_await(compactor.on_compacted(client_id, sid))
        except Exception:
            log.exception("compaction.hook_failed", client=client_id, session=sid)


def _cap_reached(compactor: Compactor, client: ClientRecords) -> str | None:
    cfg, parts = compactor.config, compactor.run_parts
    return cap_reached(
        cfg.max_input_tokens_per_day_per_client,
        cfg.max_input_tokens_per_day,
        client.ledger,
        [other.ledger for other in parts.clients.values()],
        day_of(parts.clock()),
    )


async def recompact_one(compactor: Compactor, client: ClientRecords, sid: str) -> dict[str, Any]:
    """One re-compaction, tracked as running so a restore of the session cancels it."""
    schedule = compactor.run_parts.schedule
    client.layout.session_file(sid)
    key = (client.layout.client_id, sid)
    if schedule.busy(key):
        return {"session_id": sid, "result": "busy", "error": "a compaction is running"}
    work = _recompact(compactor, client, sid)
    job = await schedule.track(key, work, f"recompaction:{sid}")
    if job.cancelled():
        return {
            "session_id": sid,
            "result": "cancelled",
            "error": "the session was restored or compaction stopped",
        }
    return job.result()


async def _recompact(compactor: Compactor, client: ClientRecords, sid: str) -> dict[str, Any]:
    parts = compactor.run_parts
    async with parts.bound:
        if (reason := _cap_reached(compactor, client)) is not None:
            resets = iso(next_day(parts.clock()))
            error = f"deferred: {reason}; ask again after {resets}"
            return {"session_id": sid, "result": "deferred", "error": error}
        settings = compactor.settings()
        try:
            out = await _run(compactor, recompact_session, client, sid)
        except Exception as exc:
            error = outcomes.reason(exc)
            rec = client.get(sid)
            if rec is not None and rec.state == S.COMPACTED:
                client.set(sid, S.COMPACTED, parts.clock(), last_error=error)
            log.warning(
                "compaction.recompact_failed",
                client=client.layout.client_id,
                session=sid,
                error=error,
            )
            return {"session_id": sid, "result": "failed", "error": error}
    if out.result == "recompacted":
        outcomes.compacted(client, sid, out, settings, parts.clock())
    return {"session_id": sid, "result": out.result, "error": None}


async def maybe_await(result: Any) -> None:
    """Await a hook's result if it is awaitable (hooks may be plain or async functions)."""
    if inspect.isawaitable(result):
        await result
