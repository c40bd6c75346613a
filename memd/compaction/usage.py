"""What compaction spent: tokens per LLM call, kept per session and UTC day, and the daily cap.

Every answered call adds its input and output tokens, as the API's `usage` reports them,
or, when the API gives none, an estimate (about four characters per token) counted in
`estimated_requests`. Rows live in the client's compaction.sqlite3 (table `usage`, one
row per session and day), so totals survive restarts and restores. Days are UTC days:
the cap resets at 00:00 UTC, as providers' daily billing does.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and code
USAGE_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    session_id TEXT NOT NULL, day TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0, estimated_requests INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, day));
"""


def estimate_tokens(text: str) -> int:
    """A token count for a call whose API reported none (marked as estimated)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def day_of(ts: float) -> str:
    """The UTC day `ts` falls in, as `YYYY-MM-DD`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def next_day(ts: float) -> float:
    """00:00 UTC after `ts`: when a cap reached at `ts` lets compactions run again."""
    day = datetime.fromtimestamp(ts, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day + timedelta(days=1)).timestamp()


@dataclass
class Usage:
    """Tokens of some LLM calls; `add` is called once per answered call."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    estimated_requests: int = 0

    def add(self, input_tokens: int, output_tokens: int, *, estimated: bool = False) -> None:
        self.input_tokens += max(0, int(input_tokens))
        self.output_tokens += max(0, int(output_tokens))
        self.requests += 1
        self.estimated_requests += int(estimated)

    def record(self, prompt: str, answer: str, counts: tuple[int, int] | None) -> None:
        """One answered call: the API's counts (see `reported`), else an estimate."""
        if counts is None:
            self.add(estimate_tokens(prompt), estimate_tokens(answer), estimated=True)
        else:
            self.add(*counts)

    def merge(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.requests += other.requests
        self.estimated_requests += other.estimated_requests

    def public(self) -> dict[str, int]:
        return asdict(self)

    def __bool__(self) -> bool:
        return self.requests > 0


def total(items: Iterable[Usage]) -> Usage:
    out = Usage()
    for item in items:
        out.merge(item)
    return out


Persist = Callable[[str, str, "Usage"], None]


def load_rows(db: sqlite3.Connection) -> dict[tuple[str, str], Usage]:
    """Every (session, day) row of the `usage` table, made if missing (blocking: sqlite)."""
    db.executescript(USAGE_SCHEMA)
    rows = db.execute(
        "SELECT session_id, day, input_tokens, output_tokens, requests,"
        " estimated_requests FROM usage"
    ).fetchall()
    return {(r[0], r[1]): Usage(*r[2:]) for r in rows}


def add_row(db: sqlite3.Connection, session_id: str, day: str, usage: Usage) -> None:
    """Add `usage` to the session's row for `day` (blocking: sqlite)."""
    db.execute(
        "INSERT INTO usage (session_id, day, input_tokens, output_tokens, requests,"
        " estimated_requests) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, day)"
        " DO UPDATE SET input_tokens = input_tokens + excluded.input_tokens,"
        " output_tokens = output_tokens + excluded.output_tokens,"
        " requests = requests + excluded.requests,"
        " estimated_requests = estimated_requests + excluded.estimated_requests",
        (
            session_id,
            day,
            usage.input_tokens,
            usage.output_tokens,
            usage.requests,
            usage.estimated_requests,
        ),
    )


class Ledger:
    """One client's usage rows, in memory for status and the cap.

    `persist` writes each addition through; the client's records hand it to their sqlite
    thread (memd.compaction.store), so counting never waits on the database.
    """

    def __init__(self, rows: dict[tuple[str, str], Usage], persist: Persist | None = None) -> None:
        self.rows = rows
        self._persist = persist

    def add(self, session_id: str, day: str, usage: Usage) -> None:
        """Count `usage` for the session on `day` (nothing to do for no calls)."""
        if not usage:
            return
        self.rows.setdefault((session_id, day), Usage()).merge(usage)
        if self._persist is not None:
            self._persist(session_id, day, replace(usage))

    def sessions(self) -> set[str]:
        return {sid for sid, _ in self.rows}

    def today(self, day: str) -> Usage:
        return total(u for (_, d), u in self.rows.items() if d == day)

    def summary(self, day: str, session_id: str | None = None) -> dict[str, Any]:
        """`{"today": {...}, "total": {...}}` for one session, or the whole client."""
        mine = [(d, u) for (s, d), u in self.rows.items() if session_id is None or s == session_id]
        return {
            "today": total(u for d, u in mine if d == day).public(),
            "total": total(u for _, u in mine).public(),
        }


def summary_of(ledgers: Iterable[Ledger], day: str) -> dict[str, Any]:
    """Totals over several clients, shaped as `Ledger.summary`."""
    ledgers = list(ledgers)
    return {
        "today": total(led.today(day) for led in ledgers).public(),
        "total": total(total(led.rows.values()) for led in ledgers).public(),
    }


def reported(resp: Any) -> tuple[int, int] | None:
    """Input and output tokens from an SDK response's usage, or None when it has none.

    openai: `usage.prompt_tokens/completion_tokens`; anthropic: `usage.input_tokens/
    output_tokens`; gemini: `usage_metadata.prompt_token_count/candidates_token_count`.
    """
    usage = getattr(resp, "usage", None)
    pairs = [("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")]
    if usage is None:
        usage = getattr(resp, "usage_metadata", None)
        pairs = [("prompt_token_count", "candidates_token_count")]
    if usage is None:
        return None
    for inp, out in pairs:
        got_in, got_out = getattr(usage, inp, None), getattr(usage, out, None)
        if isinstance(got_in, int) and not isinstance(got_in, bool):
            return got_in, got_out if isinstance(got_out, int) else 0
    return None


def cap_reached(
    per_client: int, in_all: int, client: Ledger, everyone: Iterable[Ledger], day: str
) -> str | None:
    """Why no compaction may start now (a daily cap is reached), or None; 0 means no cap.

    Checked before each compaction starts: one that started below a cap runs to its end,
    so a day can overshoot by at most the compactions running at that moment.
    """
    if per_client and client.today(day).input_tokens >= per_client:
        return f"this client's daily cap of {per_client:,} input tokens is reached"
    if in_all and sum(led.today(day).input_tokens for led in everyone) >= in_all:
        return f"the daily cap of {in_all:,} input tokens for all clients is reached"
    return None
