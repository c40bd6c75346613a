"""What compaction shows in sessions.list and status: per-session rows, tokens, the caps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memd.compaction.schedule import Schedule
from memd.compaction.store import ClientRecords, S
from memd.compaction.usage import Ledger, day_of, next_day, summary_of
from memd.config import CompactionConfig
from memd.markdown import iso


def session_rows(client: ClientRecords, running: set[str], day: str) -> dict[str, dict[str, Any]]:
    """Each submitted session's compaction row, with its tokens (today and overall)."""
    rows: dict[str, dict[str, Any]] = {}
    for sid, rec in sorted(client.records.items()):
        rows[sid] = rec.public(client.layout, sid in running)
        rows[sid]["tokens"] = client.ledger.summary(day, sid)
    return rows


def session_tokens(client: ClientRecords, day: str) -> dict[str, dict[str, Any]]:
    """Tokens of every session that spent any, with or without a state row.

    A restored session has no row (it is compacted again when it next ends) but keeps
    what it spent.
    """
    return {sid: client.ledger.summary(day, sid) for sid in sorted(client.ledger.sessions())}


def client_status(
    client: ClientRecords,
    schedule: Schedule,
    config: CompactionConfig,
    ledgers: list[Ledger],
    now: float,
) -> dict[str, Any]:
    """One client's counts per state, what runs and waits, every failure, tokens, its cap."""
    cid = client.layout.client_id
    day = day_of(now)
    failures = [
        rec.public(client.layout) for rec in client.records.values() if rec.state == S.FAILED
    ]
    return {
        **client.counts(),
        "running": schedule.running_of(cid),
        "queued": schedule.queued_of(cid),
        "failures": failures,
        "tokens": client.ledger.summary(day),
        "cap": client_cap(config, client.ledger, ledgers, day, now),
    }


def compactor_status(
    config: CompactionConfig,
    schedule: Schedule,
    clients: Mapping[str, ClientRecords],
    now: float,
) -> dict[str, Any]:
    """The whole compactor: config in force, queue sizes, tokens and the cap over all clients."""
    day = day_of(now)
    ledgers = [c.ledger for c in clients.values()]
    return {
        "enabled": config.enabled,
        "llm_provider": config.llm_provider,
        "queued": len(schedule.queued),
        "running": len(schedule.running),
        "scheduled": len(schedule.due),
        "deferred": sum(c.counts()[S.DEFERRED] for c in clients.values()),
        "tokens": summary_of(ledgers, day),
        "cap": total_cap(config, ledgers, day, now),
    }


def client_cap(
    config: CompactionConfig, ledger: Ledger, ledgers: list[Ledger], day: str, now: float
) -> dict[str, Any]:
    """The client's cap: its own limit (0 = none), today's input so far, and `reached`
    when its compactions wait (its own cap, or the one for all clients)."""
    limit = config.max_input_tokens_per_day_per_client
    spent = ledger.today(day).input_tokens
    out = _cap(limit, spent, now)
    out["reached"] = out["reached"] or total_cap(config, ledgers, day, now)["reached"]
    return {"max_input_tokens_per_day_per_client": limit, **out}


def total_cap(
    config: CompactionConfig, ledgers: list[Ledger], day: str, now: float
) -> dict[str, Any]:
    """The cap over all clients, and the per-client limit in force."""
    spent = sum(led.today(day).input_tokens for led in ledgers)
    out = {
        "max_input_tokens_per_day": config.max_input_tokens_per_day,
        **_cap(config.max_input_tokens_per_day, spent, now),
    }
    out["max_input_tokens_per_day_per_client"] = config.max_input_tokens_per_day_per_client
    return out


def _cap(limit: int, spent: int, now: float) -> dict[str, Any]:
    return {
        "input_tokens_today": spent,
        "reached": bool(limit) and spent >= limit,
        "resets_at": iso(next_day(now)),
        "day": day_of(now),
    }
