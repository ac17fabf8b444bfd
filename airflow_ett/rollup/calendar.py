"""Days in a configured time zone, as the `[lo, hi)` windows of Unix seconds the model cuts.

A rollup day is a calendar day where the platform team lives, not a UTC day: the report
for 2026-11-28 in `America/Los_Angeles` covers that day's local midnight to the next. On a
daylight-saving change a day is 23 or 25 hours long; pendulum knows the zone's rules, so
the windows of consecutive days always tile time without gap or overlap.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

import pendulum
from pendulum.tz.exceptions import InvalidTimezone

from airflow_ett.ett.events import TS_MAX, TS_MIN

#: A backfill longer than this is refused: it is almost always a mistyped date.
MAX_DAYS: int = 3660
#: The first and last day a rollup or a report may name: the UTC days event times can
#: lie in (`TS_MIN`, `TS_MAX`). Outside them no job can have run, and near the ends of
#: `datetime`'s range the day after (a window's end) or before (a report's comparison)
#: does not exist (`--date 9999-12-31` was an OverflowError).
FIRST_DAY: dt.date = dt.datetime.fromtimestamp(TS_MIN, dt.UTC).date()
LAST_DAY: dt.date = dt.datetime.fromtimestamp(TS_MAX, dt.UTC).date() - dt.timedelta(days=1)


class CalendarError(ValueError):
    """A time zone, date or range that cannot name rollup days."""


@dataclass(frozen=True, slots=True)
class DayWindow:
    """One calendar day in `tz`: `[lo, hi)` in Unix seconds."""

    day: dt.date
    tz: str
    lo: float
    hi: float

    @property
    def iso(self) -> str:
        return self.day.isoformat()

    @property
    def hours(self) -> float:
        return (self.hi - self.lo) / 3600.0


def check_tz(tz: str) -> str:
    """The zone name, if pendulum knows it (`CalendarError` naming it if not)."""
    try:
        pendulum.timezone(tz)
    except (InvalidTimezone, ValueError) as exc:
        raise CalendarError(f"timezone: unknown time zone {tz!r} (an IANA name such as "
                            "'UTC' or 'Europe/Berlin')") from exc
    return tz


def check_day(day: dt.date, *, field: str = "date") -> dt.date:
    """`day`, if it lies in `[FIRST_DAY, LAST_DAY]`; `CalendarError` naming it if not."""
    if not FIRST_DAY <= day <= LAST_DAY:
        raise CalendarError(f"{field}: {day.isoformat()} is not a day events can fall in "
                            f"({FIRST_DAY.isoformat()} to {LAST_DAY.isoformat()})")
    return day


def parse_day(text: str, *, field: str = "date") -> dt.date:
    """`YYYY-MM-DD` as a date in `[FIRST_DAY, LAST_DAY]`; `CalendarError` naming the
    field and value otherwise."""
    try:
        day = dt.date.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise CalendarError(f"{field}: {text!r} is not a date (YYYY-MM-DD)") from exc
    return check_day(day, field=field)


def day_window(day: dt.date, tz: str) -> DayWindow:
    zone = pendulum.timezone(check_tz(tz))
    start = pendulum.datetime(day.year, day.month, day.day, tz=zone)
    end = start.add(days=1)
    return DayWindow(day=day, tz=tz, lo=float(start.timestamp()), hi=float(end.timestamp()))


def day_of(ts: float, tz: str) -> dt.date:
    """The calendar day in `tz` that Unix time `ts` falls in."""
    local = pendulum.from_timestamp(ts, tz=pendulum.timezone(check_tz(tz)))
    return dt.date(local.year, local.month, local.day)


def days(first: dt.date, last: dt.date) -> list[dt.date]:
    """Every day from `first` to `last`, both included."""
    if last < first:
        raise CalendarError(f"to: {last.isoformat()} is before from: {first.isoformat()}")
    count = (last - first).days + 1
    if count > MAX_DAYS:
        raise CalendarError(f"from/to: {count} days is more than the {MAX_DAYS} a rollup "
                            "takes at once")
    return [first + dt.timedelta(days=i) for i in range(count)]


def windows(first: dt.date, last: dt.date, tz: str) -> Iterator[DayWindow]:
    for day in days(first, last):
        yield day_window(day, tz)
