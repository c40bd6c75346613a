"""Dates people say, resolved: in a query against now, in an exchange against its own time.

People rarely say dates the way an index stores them. They say "yesterday", "last
Saturday", "two weeks ago" (meaning the exchange's own time, which its heading holds) or
ask "what did we do in May?". Recall uses this module twice:

- `query_when(query, now)` reads the period a query names ("in May", "May 2023",
  "on 8 May", "in 2022", "last week", "three days ago"); ranking then lifts candidates
  whose exchange (or a date said in it) falls in that period (memd.indexing.query.ranking).
  A month or day without a year means that month in any year: the memory decides which.
- `said_dates(text, when)` finds the relative dates said in an exchange and resolves them
  against the exchange's time, so a result can show "yesterday = 7 May 2023" and a date
  said in it counts for the period a query names.

A small English grammar rather than a general date parser: recall runs it on every
candidate of every query (~40 texts), which must cost well under a millisecond, and the
words that matter are few ("may" the verb is not May: a month name counts only after
"in"/"of"/"during", before or after a day number, or before a year).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from memd.indexing.query.memo import TextMemo

MONTHS = {
    m: i
    for i, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        1,
    )
    for m in names
}
WEEKDAYS = {
    d: i
    for i, d in enumerate(
        ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    )
}
NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3,
    "couple of": 2, "few": 3, "several": 3,
}  # fmt: skip
_MONTH = (
    r"(january|february|march|april|may|june|july|august|september|october|november"
    r"|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
)
_YEAR = r"((?:19|20)\d\d)"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_NUM = (
    r"(\d+|an?|one|two|three|four|five|six|seven|eight|nine|ten"
    r"|(?:a )?couple of|(?:a )?few|several)"
)
_UNIT = r"(day|week|weekend|month|year)s?"
_WEEKDAY = r"(monday|tuesday|wednesday|thursday|friday|saturday|sunday)"

# Absolute forms (for queries); each yields a Period.
_ISO_RE = re.compile(r"\b(\d{4})-(\d\d)-(\d\d)\b")
_DAY_MONTH_RE = re.compile(rf"\b{_DAY} (?:of )?{_MONTH}(?:,? {_YEAR})?\b")
_MONTH_DAY_RE = re.compile(rf"\b{_MONTH} {_DAY}(?:,? {_YEAR})?\b")
_MONTH_YEAR_RE = re.compile(rf"\b{_MONTH},? (?:of )?{_YEAR}\b")
_IN_MONTH_RE = re.compile(
    rf"\b(?:in|of|during|since|early|late|mid|mid-|last|this|next) {_MONTH}\b"
)
_IN_YEAR_RE = re.compile(rf"\b(?:in|of|during|since|year) {_YEAR}\b")
# Relative forms (queries against now; exchanges against their own time).
_SIMPLE = {
    "today": (0, 1),
    "tonight": (0, 1),
    "this morning": (0, 1),
    "this afternoon": (0, 1),
    "this evening": (0, 1),
    "yesterday": (-1, 1),
    "last night": (-1, 1),
    "tomorrow": (1, 1),
    "the day before yesterday": (-2, 1),
    "the other day": (-4, 4),
    "recently": (-30, 30),
}
_SIMPLE_RE = re.compile(r"\b(" + "|".join(sorted(_SIMPLE, key=len, reverse=True)) + r")\b")
_AGO_RE = re.compile(rf"\b{_NUM} {_UNIT} ago\b")
_IN_NUM_RE = re.compile(rf"\bin {_NUM} {_UNIT}\b")
_LAST_RE = re.compile(rf"\b(last|this|next|past) {_UNIT}\b")
_LAST_WEEKDAY_RE = re.compile(rf"\b(last|this|next|on) {_WEEKDAY}\b")


@dataclass(frozen=True)
class Period:
    """[start, end) of dates, or a month/day in any year (`year` None)."""

    start: date
    end: date
    any_year: bool = False

    def holds(self, day: date) -> bool:
        if not self.any_year:
            return self.start <= day < self.end
        shifted = _replace_year(day, self.start.year)
        return shifted is not None and self.start <= shifted < self.end

    def overlaps(self, other: Period) -> bool:
        if self.any_year or other.any_year:
            return any(self.holds(other.start + timedelta(d)) for d in range(_span(other)))
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class Said:
    """A relative date said in a text and the period it names."""

    phrase: str
    period: Period

    def absolute(self) -> str:
        """`yesterday = 7 May 2023`, `last week = 1–7 May 2023`, `last month = April 2023`."""
        return f"{self.phrase} = {describe(self.period)}"


def query_when(query: str, now: datetime) -> Period | None:
    """The period a query names, absolute or relative to `now`; None when it names none
    (the first one found wins)."""
    text = query.lower()
    found = _absolute(text, now.date())
    if found is not None:
        return found
    said = said_dates(text, now)
    return said[0].period if said else None


def said_dates(text: str, when: datetime) -> list[Said]:
    """Relative dates in `text` ("yesterday", "last Saturday", "two weeks ago", "next
    month"), each with the period it names, resolved against `when`."""
    lowered = text.lower()
    if len(lowered) > CACHED_CHARS:
        return list(_said(lowered, when.date()))
    return list(_said_memo(lowered, when.date()))


CACHED_CHARS = 4096  # longer texts are not remembered (the memo holds 8,192 of them)


# Every relative form above holds one of these (each weekday ends in "day", "weekend"
# holds "week"): a text with none says no relative date, and five regex passes are
# skipped for it. Three texts in four of LoCoMo's exchanges hold none; the check costs
# ~1 µs against ~40 µs for the passes (tests/test_recall_dates.py holds them equal).
_TRIGGERS = (
    "day", "week", "month", "year", "night", "morning", "afternoon", "evening",
    "tomorrow", "recently",
)  # fmt: skip


def _said(text: str, today: date) -> tuple[Said, ...]:
    """The relative dates `text` (lower-cased) says, resolved against `today`."""
    if not any(word in text for word in _TRIGGERS):
        return ()
    return _said_everywhere(text, today)


def _said_everywhere(text: str, today: date) -> tuple[Said, ...]:
    out: list[Said] = []
    for m in _SIMPLE_RE.finditer(text):
        shift, days = _SIMPLE[m.group(1)]
        start = today + timedelta(shift)
        out.append(Said(m.group(0), Period(start, start + timedelta(days))))
    for m in _AGO_RE.finditer(text):
        out.append(Said(m.group(0), _shifted(today, -_count(m.group(1)), m.group(2))))
    for m in _IN_NUM_RE.finditer(text):
        out.append(Said(m.group(0), _shifted(today, _count(m.group(1)), m.group(2))))
    for m in _LAST_RE.finditer(text):
        step = {"last": -1, "past": -1, "this": 0, "next": 1}[m.group(1)]
        out.append(Said(m.group(0), _shifted(today, step, m.group(2))))
    for m in _LAST_WEEKDAY_RE.finditer(text):
        out.append(Said(m.group(0), _weekday(today, m.group(1), WEEKDAYS[m.group(2)])))
    return tuple(out)


# Keyed by the text's digest, not the text (memd.indexing.query.memo): recall asks it of
# the same chunks search after search.
_said_memo: TextMemo[tuple[Said, ...]] = TextMemo(_said, maxsize=8192)


def _absolute(text: str, today: date) -> Period | None:
    if m := _ISO_RE.search(text):
        with_day = _day(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if with_day is not None:
            return with_day
    for rx, day_at, month_at in ((_DAY_MONTH_RE, 1, 2), (_MONTH_DAY_RE, 2, 1)):
        if (m := rx.search(text)) and 1 <= int(m.group(day_at)) <= 31:
            year = m.group(3)
            found = _day(
                int(year) if year else 2000, MONTHS[m.group(month_at)], int(m.group(day_at))
            )
            if found is not None:
                return found if year else Period(found.start, found.end, any_year=True)
    if m := _MONTH_YEAR_RE.search(text):
        return _month(int(m.group(2)), MONTHS[m.group(1)])
    if m := _IN_MONTH_RE.search(text):
        month = _month(2000, MONTHS[m.group(1)])
        return Period(month.start, month.end, any_year=True)
    if m := _IN_YEAR_RE.search(text):
        year = int(m.group(1))
        return Period(date(year, 1, 1), date(year + 1, 1, 1))
    return None


def _day(year: int, month: int, day: int) -> Period | None:
    try:
        start = date(year, month, day)
    except ValueError:
        return None
    return Period(start, start + timedelta(1))


def _month(year: int, month: int) -> Period:
    start = date(year, month, 1)
    end = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
    return Period(start, end)


def _count(word: str) -> int:
    return int(word) if word.isdigit() else NUMBERS.get(word, 1)


def _shifted(today: date, n: int, unit: str) -> Period:
    """The day, week (Monday to Sunday), weekend, month or year `n` units from today's."""
    if unit == "day":
        start = today + timedelta(n)
        return Period(start, start + timedelta(1))
    if unit in ("week", "weekend"):
        monday = today - timedelta(today.weekday()) + timedelta(weeks=n)
        if unit == "weekend":
            return Period(monday + timedelta(5), monday + timedelta(7))
        return Period(monday, monday + timedelta(7))
    if unit == "month":
        index = today.year * 12 + today.month - 1 + n
        return _month(index // 12, index % 12 + 1)
    year = today.year + n
    return Period(date(year, 1, 1), date(year + 1, 1, 1))


def _weekday(today: date, which: str, weekday: int) -> Period:
    """`last Saturday`: the Saturday before today; `next`/`this`: the coming one; `on`:
    the latest one up to today (people mostly tell what happened)."""
    back = (today.weekday() - weekday) % 7
    if which == "last":
        start = today - timedelta(back or 7)
    elif which == "on":
        start = today - timedelta(back)
    else:
        start = today + timedelta((weekday - today.weekday()) % 7 or 7)
    return Period(start, start + timedelta(1))


def _replace_year(day: date, year: int) -> date | None:
    try:
        return day.replace(year=year)
    except ValueError:  # 29 February
        return None


def _span(period: Period) -> int:
    return max((period.end - period.start).days, 1)


def describe(period: Period) -> str:
    """A period as people write it: `7 May 2023`, `1–7 May 2023`, `May 2023`, `2023`."""
    days = _span(period)
    last = period.end - timedelta(1)
    year = "" if period.any_year else f" {period.start.year}"
    if days == 1:
        return f"{period.start.day} {period.start:%B}{year}"
    if period.start.day == 1 and period.end.day == 1 and days <= 31:
        return f"{period.start:%B}{year}"
    if period.start.month == 1 and period.start.day == 1 and days >= 365:
        return str(period.start.year)
    if period.start.month == last.month:
        return f"{period.start.day}–{last.day} {last:%B}{year}"
    return f"{period.start.day} {period.start:%B} – {last.day} {last:%B}{year}"


def day_of(moment: datetime) -> date:
    """The UTC date of an aware (or naive = UTC) datetime."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).date()
