"""One compaction or re-compaction run of the `Compactor` (memd.compaction.service).

The job (memd.compaction.job) under the compactor's concurrency bound and daily token
caps, with the settings in force when it starts, and its outcome recorded
(memd.compaction.outcomes). The compactor decides *when* a run happens (its queue,
workers and retries); these functions are what one run does, kept apart for size, and
read the compactor's state as its own methods would.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import structlog

from memd.compaction import outcomes
from memd.compaction.job import Outcome, compact_session, recompact_session
from memd.compaction.schedule import Key
from memd.compaction.store import ClientRecords, S
from memd.compaction.usage import Usage, cap_reached, day_of, next_day
from memd.markdown import iso

if TYPE_CHECKING:
    from memd.compaction.service import Compactor, Job

log = structlog.get_logger()


async def _run(compactor: Compactor, job: Job, client: ClientRecords, sid: str) -> Outcome:
    """One compaction or re-compaction with the settings in force now; what it spent
    counts, also for one that fails or is cancelled."""
    usage = Usage()
    try:
        return await job(
            client.layout,
            sid,
            compactor.settings(),
            max_request_chars=compactor.max_request_chars,
            clock=compactor._clock,
            step_hook=compactor._step_hook,
            usage=usage,
            guard=client.guard,
        )
    finally:
        if usage:
            client.ledger.add(sid, day_of(compactor._clock()), usage)


async def compact(compactor: Compactor, key: Key) -> None:
    client_id, sid = key
    client = compactor._clients.get(client_id)
    rec = client.get(sid) if client is not None else None
    if client is None or rec is None or rec.state != S.PENDING:
        return  # restored, or the client closed, while it waited
    async with compactor._sem:
        if (reason := _cap_reached(compactor, client)) is not None:
            outcomes.deferred(client, compactor._schedule, sid, reason, compactor._clock())
            return
        settings = compactor.settings()
        try:
            out = await _run(compactor, compact_session, client, sid)
        except Exception as exc:  # whatever it was, nothing half-done is left: retry later
            outcomes.failed(
                client, compactor._schedule, sid, exc, compactor.backoff, compactor._clock()
            )
            return
    if out.result == "missing":
        compactor._set(client, sid, S.MISSING, last_error="no transcript in sessions/ or archive/")
        return
    outcomes.compacted(client, sid, out, settings, compactor._clock())
    if compactor.on_compacted is not None:
        try:
            await _maybe_await(compactor.on_compacted(client_id, sid))
        except Exception:
            log.exception("compaction.hook_failed", client=client_id, session=sid)


def _cap_reached(compactor: Compactor, client: ClientRecords) -> str | None:
    cfg = compactor.config
    return cap_reached(
        cfg.max_input_tokens_per_day_per_client,
        cfg.max_input_tokens_per_day,
        client.ledger,
        [other.ledger for other in compactor._clients.values()],
        day_of(compactor._clock()),
    )


async def recompact_one(compactor: Compactor, client: ClientRecords, sid: str) -> dict[str, Any]:
    """One re-compaction, tracked as running so a restore of the session cancels it."""
    client.layout.session_file(sid)
    key = (client.layout.client_id, sid)
    if compactor._schedule.busy(key):
        return {"session_id": sid, "result": "busy", "error": "a compaction is running"}
    work = _recompact(compactor, client, sid)
    job = await compactor._schedule.track(key, work, f"recompaction:{sid}")
    if job.cancelled():
        return {
            "session_id": sid,
            "result": "cancelled",
            "error": "the session was restored or compaction stopped",
        }
    return job.result()


async def _recompact(compactor: Compactor, client: ClientRecords, sid: str) -> dict[str, Any]:
    async with compactor._sem:
        if (reason := _cap_reached(compactor, client)) is not None:
            resets = iso(next_day(compactor._clock()))
            error = f"deferred: {reason}; ask again after {resets}"
            return {"session_id": sid, "result": "deferred", "error": error}
        settings = compactor.settings()
        try:
            out = await _run(compactor, recompact_session, client, sid)
        except Exception as exc:
            error = outcomes.reason(exc)
            rec = client.get(sid)
            if rec is not None and rec.state == S.COMPACTED:
                compactor._set(client, sid, S.COMPACTED, last_error=error)
            log.warning(
                "compaction.recompact_failed",
                client=client.layout.client_id,
                session=sid,
                error=error,
            )
            return {"session_id": sid, "result": "failed", "error": error}
    if out.result == "recompacted":
        outcomes.compacted(client, sid, out, settings, compactor._clock())
    return {"session_id": sid, "result": out.result, "error": None}


async def _maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result
