"""What the end of a run does to its session: compacted, failed (retry later) or deferred.

Each records the new state through `ClientRecords.set` and, for a retry, when it is due
in the Compactor's `Schedule`.
"""

from __future__ import annotations

import structlog

from memd.compaction.job import Outcome
from memd.compaction.llm import LLMSettings
from memd.compaction.schedule import Schedule
from memd.compaction.store import Backoff, ClientRecords, S
from memd.compaction.usage import next_day
from memd.markdown import iso

log = structlog.get_logger()


def compacted(
    client: ClientRecords, sid: str, out: Outcome, settings: LLMSettings, now: float
) -> None:
    """A summary is in place (what made it: from the outcome, else the run's `settings`)."""
    client.set(
        sid,
        S.COMPACTED,
        now,
        last_error=None,
        next_retry=None,
        compacted_at=out.compacted_at or now,
        llm_provider=out.llm_provider or settings.provider,
        llm_model=out.llm_model or settings.model,
        parts=out.parts,
        requests=out.requests,
    )


def failed(
    client: ClientRecords,
    schedule: Schedule,
    sid: str,
    exc: Exception,
    backoff: Backoff,
    now: float,
) -> None:
    """Nothing half-done is left: try again after the backoff for this many attempts."""
    attempts = client.records[sid].attempts + 1
    delay = backoff.delay(attempts)
    error = reason(exc)
    client.set(sid, S.FAILED, now, attempts=attempts, last_error=error, next_retry=now + delay)
    schedule.later((client.layout.client_id, sid), now + delay)
    log.warning(
        "compaction.failed",
        client=client.layout.client_id,
        session=sid,
        attempts=attempts,
        retry_in=round(delay, 3),
        error=error,
    )


def deferred(client: ClientRecords, schedule: Schedule, sid: str, why: str, now: float) -> None:
    """At a cap: wait, untouched and searchable, until the next UTC day starts."""
    at = next_day(now)
    client.set(sid, S.DEFERRED, now, last_error=f"deferred: {why}", next_retry=at)
    schedule.later((client.layout.client_id, sid), at)
    log.info(
        "compaction.deferred",
        client=client.layout.client_id,
        session=sid,
        reason=why,
        until=iso(at),
    )


def reason(exc: Exception) -> str:
    """`last_error` of a failed run: the error's reason (LLM errors have one) and message."""
    return f"{getattr(exc, 'reason', type(exc).__name__)}: {exc}"
