"""Time filters for recall over memd's exchange headings.

Exchange headings carry their time (`## 2026-11-30 02:41:07 UTC · exchange 3`): a range on
`heading` narrows the search in Milvus (the heading time format sorts as text), then each
hit's heading is parsed to apply the exact bounds. Chunks without an exchange heading
(summaries) have no time and are left out of time-filtered searches.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memd.markdown import heading_time, parse_exchange_title

# The last second datetime can step past; no exchange is recorded that late, so a
# `before` there needs no bound in Milvus (and +1 s would overflow).
_END_OF_TIME = datetime.max.replace(tzinfo=UTC) - timedelta(seconds=1)


def time_filter_expr(after: datetime | None, before: datetime | None) -> str:
    """A `heading` range that contains every exchange in [after, before) (and maybe a few
    non-exchange headings, which the exact check drops)."""
    parts = []
    if after is not None:
        floor = _aware(after).replace(microsecond=0)
        parts.append(f'heading >= "{heading_time(floor)}"')
    if before is not None and _aware(before) < _END_OF_TIME:
        ceil = _aware(before).replace(microsecond=0) + timedelta(seconds=1)
        parts.append(f'heading < "{heading_time(ceil)}"')
    return " and ".join(parts)


def in_range(when: datetime | None, after: datetime | None, before: datetime | None) -> bool:
    """after is inclusive, before exclusive; a chunk without a time is in no range."""
    if after is None and before is None:
        return True
    if when is None:
        return False
    if after is not None and when < _aware(after).replace(microsecond=0):
        return False
    return before is None or when < _aware(before)


def _aware(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC, like the transcript headings."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def exchange_time(heading: str) -> datetime | None:
    parsed = parse_exchange_title(heading)
    return parsed[0] if parsed else None
