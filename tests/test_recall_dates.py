"""Dates people say, resolved against the exchange's own time or the query's now, and
what ranking does with them (memd.indexing.query.dates, memd.indexing.query.timing)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.indexing.query import dates, timing

SAID_AT = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I went to a support group yesterday", ["yesterday = 7 May 2023"]),
        ("we ran a charity race last Saturday", ["last saturday = 6 May 2023"]),
        ("I signed up two weeks ago", ["two weeks ago = 24–30 April 2023"]),
        ("we went camping two weekends ago", ["two weekends ago = 29–30 April 2023"]),
        ("the conference is next month", ["next month = June 2023"]),
        ("my 18th birthday was 10 years ago", ["10 years ago = 2013"]),
        ("we moved last year", ["last year = 2022"]),
        ("I may go, or I may not", []),
    ],
)
def test_relative_dates_in_an_exchange_resolve_against_its_time(
    text: str, expected: list[str]
) -> None:
    assert [s.absolute() for s in dates.said_dates(text, SAID_AT)] == expected


@pytest.mark.parametrize(
    ("query", "start", "end", "any_year"),
    [
        ("When did Melanie go camping in June?", date(2000, 6, 1), date(2000, 7, 1), True),
        ("what did we talk about in May 2023", date(2023, 5, 1), date(2023, 6, 1), False),
        ("what happened on 8 May 2023", date(2023, 5, 8), date(2023, 5, 9), False),
        ("the dinner on May 8", date(2000, 5, 8), date(2000, 5, 9), True),
        ("what did I buy in 2022", date(2022, 1, 1), date(2023, 1, 1), False),
        ("what did I say yesterday", date(2023, 5, 7), date(2023, 5, 8), False),
        ("the plan from last week", date(2023, 5, 1), date(2023, 5, 8), False),
        ("2023-05-06 standup", date(2023, 5, 6), date(2023, 5, 7), False),
    ],
)
def test_a_query_names_a_period(query: str, start: date, end: date, any_year: bool) -> None:
    assert dates.query_when(query, SAID_AT) == dates.Period(start, end, any_year)


def test_may_the_verb_names_no_period() -> None:
    assert dates.query_when("may I ask what my favourite film is", SAID_AT) is None


def test_a_month_without_a_year_holds_that_month_of_any_year() -> None:
    june = dates.query_when("in June", SAID_AT)
    assert june is not None
    assert june.holds(date(2023, 6, 27)) and june.holds(date(2019, 6, 1))
    assert not june.holds(date(2023, 7, 1))


def test_the_period_a_query_names_lifts_exchanges_of_that_time_only() -> None:
    """Two camping trips: "in June" lifts the June exchange (its own time) and the July
    one that says "last week" about late June; not the July trip."""
    texts = {
        "june": ("2023-06-27 10:00:00 UTC · exchange 3", "we went camping last weekend"),
        "late": ("2023-07-03 10:00:00 UTC · exchange 1", "camping last week was great"),
        "july": ("2023-07-17 10:00:00 UTC · exchange 1", "we went camping again"),
    }
    lifts = timing.lifts("When did Melanie go camping in June?", texts, SAID_AT)
    assert lifts["june"] > lifts.get("july", 0.0)
    assert lifts["late"] > lifts.get("july", 0.0)


def test_a_when_question_lifts_exchanges_that_tell_a_time() -> None:
    texts = {
        "tells": ("2023-05-08 10:00:00 UTC · exchange 2", "I went to the group yesterday"),
        "names": ("2023-05-08 10:00:00 UTC · exchange 4", "the group made me feel accepted"),
    }
    lifts = timing.lifts("When did Caroline go to the support group?", texts, SAID_AT)
    assert lifts.get("tells", 0.0) > lifts.get("names", 0.0)
    assert timing.lifts("What did Caroline feel at the group?", texts, SAID_AT) == {}


# Every word the relative forms are made of, and pieces of them, joined with and without
# spaces: whatever they make, the trigger check must not skip a text the forms match.
_PIECES = sorted(
    {*dates.NUMBERS, *dates._SIMPLE, *dates.WEEKDAYS, *dates.MONTHS}
    | {"day", "week", "weekend", "month", "year", "days", "weeks", "ago", "in", "last"}
    | {"this", "next", "past", "on", "the", "other", "before", "12", "3", "we", "went"}
    | {"to", "da", "y", "wee", "k", "mon", "th", "ye", "ar", "nig", "ht", "sat", "ur"}
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from([" ", "", ", "]))))
def test_texts_the_trigger_check_skips_say_no_relative_date(
    pieces: list[tuple[str, str]],
) -> None:
    """`_said` skips the regex passes for a text without a trigger word
    (`dates._TRIGGERS`); it must find exactly what the passes find, on any text."""
    text = "".join(word + sep for word, sep in pieces)
    today = SAID_AT.date()
    assert dates._said(text, today) == dates._said_everywhere(text, today)
