"""What compaction shows in sessions.list and status: per-session rows, tokens, the caps."""

from __future__ import annotations

from typing import Any

from memd.compaction.store import ClientRecords
from memd.compaction.usage import Ledger, day_of, next_day
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


def client_cap(config: CompactionConfig, ledger: Ledger, day: str, now: float) -> dict[str, Any]:
    """The per-client cap: its limit (0 = none), today's input so far, whether it holds."""
    return _cap(config.max_input_tokens_per_day_per_client, ledger.today(day).input_tokens, now)


def total_cap(
    config: CompactionConfig, ledgers: list[Ledger], day: str, now: float
) -> dict[str, Any]:
    """The cap over all clients, and the per-client limit in force."""
    spent = sum(led.today(day).input_tokens for led in ledgers)
    out = _cap(config.max_input_tokens_per_day, spent, now)
    out["max_input_tokens_per_day_per_client"] = config.max_input_tokens_per_day_per_client
    return out


def _cap(limit: int, spent: int, now: float) -> dict[str, Any]:
    reached = bool(limit) and spent >= limit
    return {
        "max_input_tokens_per_day": limit,
        "input_tokens_today": spent,
        "reached": reached,
        "resets_at": iso(next_day(now)),
        "day": day_of(now),
    }
