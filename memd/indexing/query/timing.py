"""Time in ranking: a query that names a period, or asks when, lifts the exchanges that answer it.

Two lifts are added to a candidate's fused score (memd.indexing.query.ranking.fuse), measured
on LoCoMo's dev split (bench/locomo.py, docs/quality.md):

- `PERIOD_LIFT` when the query names a period ("in June", "on 8 May", "last week",
  memd.indexing.query.dates.query_when) and the candidate's exchange happened then, or a date
  said in it ("yesterday", "two weekends ago", resolved against the exchange's time)
  falls then. Two exchanges about camping, one in June and one in July: "when did she
  go camping in June?" should find the June one first.
- `WHEN_LIFT` when the query asks when something happened ("when did ...", "how long
  ago", "what year") and the candidate says a date: the exchange that tells when is the
  one that holds the answer, not the one that only names the event.

Neither is a filter: a candidate without the date keeps its place among the others.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

from memd.indexing.query import dates
from memd.indexing.query.time_filter import exchange_time

PERIOD_LIFT = 0.25
WHEN_LIFT = 0.15
_WHEN_RE = re.compile(
    r"^\s*when\b|\bwhat (?:date|day|year|month|time)\b|\bhow long ago\b"
    r"|\bwhich (?:year|month|day)\b",
    re.IGNORECASE,
)
_SAYS_DATE_RE = re.compile(
    r"\b(?:19|20)\d\d\b|\b(?:january|february|march|april|june|july|august|september|october"
    r"|november|december)\b|\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)s?\b"
    r"|\bweekend\b",
    re.IGNORECASE,
)


def asks_when(query: str) -> bool:
    """Whether the query asks for a time ("When did ...?", "what year ...")."""
    return bool(_WHEN_RE.search(query))


def says_date(text: str, when: datetime | None) -> bool:
    """Whether the text tells a time: a year, a month, a weekday, or a relative date."""
    if _SAYS_DATE_RE.search(text):
        return True
    return bool(dates.said_dates(text, when or datetime.now(UTC)))


def in_period(period: dates.Period, text: str, when: datetime | None) -> bool:
    """Whether an exchange at `when` with `text` happened in `period` or says a date in it."""
    if when is None:
        return False
    if period.holds(dates.day_of(when)):
        return True
    return any(period.overlaps(s.period) for s in dates.said_dates(text, when))


def lifts(
    query: str, texts: Mapping[str, tuple[str, str]], now: datetime | None = None
) -> dict[str, float]:
    """What each candidate (key -> (heading, own text)) gains from time in the ranking."""
    period = dates.query_when(query, now or datetime.now(UTC))
    when_q = asks_when(query)
    if period is None and not when_q:
        return {}
    out: dict[str, float] = {}
    for key, (heading, text) in texts.items():
        when = exchange_time(heading)
        gain = 0.0
        if period is not None and in_period(period, text, when):
            gain += PERIOD_LIFT
        if when_q and says_date(text, when):
            gain += WHEN_LIFT
        if gain:
            out[key] = gain
    return out
