from __future__ import annotations

import datetime as dt
import itertools

import pytest

from airflow_ett.ett.events import TS_MAX, TS_MIN
from airflow_ett.rollup.calendar import (
    FIRST_DAY,
    LAST_DAY,
    MAX_DAYS,
    CalendarError,
    check_day,
    check_tz,
    day_of,
    day_window,
    days,
    parse_day,
    windows,
)


def test_a_utc_day_is_86400_seconds_from_midnight() -> None:
    w = day_window(dt.date(2026, 11, 28), "UTC")
    assert w.lo == 1_795_824_000.0 and w.hi - w.lo == 86400 and w.iso == "2026-11-28"


@pytest.mark.parametrize(("day", "hours"), [
    (dt.date(2026, 3, 29), 23),  # Europe/Berlin springs forward
    (dt.date(2026, 10, 25), 25),  # and falls back
    (dt.date(2026, 6, 1), 24),
])
def test_daylight_saving_days_are_23_or_25_hours(day: dt.date, hours: int) -> None:
    assert day_window(day, "Europe/Berlin").hours == hours


def test_consecutive_days_tile_time_and_day_of_inverts_them() -> None:
    ws = list(windows(dt.date(2026, 3, 27), dt.date(2026, 4, 2), "America/Los_Angeles"))
    assert len(ws) == 7
    assert all(a.hi == b.lo for a, b in itertools.pairwise(ws))
    for w in ws:
        assert day_of(w.lo, w.tz) == w.day and day_of(w.hi - 0.001, w.tz) == w.day


def test_local_midnight_is_not_utc_midnight() -> None:
    w = day_window(dt.date(2026, 11, 28), "Asia/Tokyo")
    assert w.lo == day_window(dt.date(2026, 11, 28), "UTC").lo - 9 * 3600


def test_bad_input_is_named() -> None:
    with pytest.raises(CalendarError, match="timezone: unknown time zone 'Mars/Olympus'"):
        check_tz("Mars/Olympus")
    with pytest.raises(CalendarError, match="from: '2026-13-01' is not a date"):
        parse_day("2026-13-01", field="from")
    with pytest.raises(CalendarError, match="to: 2026-11-01 is before from: 2026-11-02"):
        days(dt.date(2026, 11, 2), dt.date(2026, 11, 1))
    first = dt.date(2000, 1, 1)
    assert len(days(first, first + dt.timedelta(days=MAX_DAYS - 1))) == MAX_DAYS
    with pytest.raises(CalendarError, match=f"{MAX_DAYS + 1} days"):
        days(first, first + dt.timedelta(days=MAX_DAYS))


def test_the_days_a_rollup_may_name_are_those_events_can_fall_in() -> None:
    assert (dt.date(2000, 1, 1), dt.date(2099, 12, 31)) == (FIRST_DAY, LAST_DAY)
    assert day_window(FIRST_DAY, "UTC").lo == TS_MIN
    assert day_window(LAST_DAY, "UTC").hi == TS_MAX
    assert check_day(FIRST_DAY) == FIRST_DAY and parse_day("2099-12-31") == LAST_DAY
    for text in ("9999-12-31", "0001-01-01", "1999-12-31", "2100-01-01"):
        with pytest.raises(CalendarError, match=f"conf.date: {text} is not a day events can "
                                                "fall in \\(2000-01-01 to 2099-12-31\\)"):
            parse_day(text, field="conf.date")
