"""`airflow-ett rollup`: compute and store the fleet's daily ETT rollups (what the nightly
DAG `ett_fleet_rollup` runs); and the date options it shares with `airflow-ett report`."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import TYPE_CHECKING

from airflow_ett.cli.common import fail, store_command, store_url, with_store

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands
    from airflow_ett.settings import RollupSettings


def date_arg(text: str) -> dt.date:
    """argparse type: a day, YYYY-MM-DD, one events can fall in (rollup.calendar's
    FIRST_DAY to LAST_DAY): a usage error otherwise, never an OverflowError later."""
    from airflow_ett.rollup.calendar import CalendarError, check_day

    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date: {text!r} (YYYY-MM-DD)") from None
    try:
        return check_day(day)
    except CalendarError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("date: ")) from None


def add_day_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--date", type=date_arg,
                        help="one day, YYYY-MM-DD (default: yesterday in the time zone)")
    parser.add_argument("--from", dest="first", type=date_arg, metavar="D1",
                        help="first day of a range (with --to)")
    parser.add_argument("--to", dest="last", type=date_arg, metavar="D2",
                        help="last day of a range, included (with --from)")
    parser.add_argument("--tz", help="time zone of the days (default: [ett] rollup_timezone)")


def day_range(args: argparse.Namespace, settings: RollupSettings) -> tuple[dt.date, dt.date]:
    """The days the options name; errors say which option is wrong."""
    from airflow_ett.rollup.calendar import MAX_DAYS, day_of

    if args.date is not None and (args.first is not None or args.last is not None):
        fail("--date: give one day, or a range with --from and --to, not both")
    if (args.first is None) != (args.last is None):
        fail("--from/--to: a range needs both --from and --to")
    if args.date is not None:
        return args.date, args.date
    if args.first is not None:
        if args.last < args.first:
            fail(f"--to: {args.last} is before --from {args.first}")
        if (args.last - args.first).days + 1 > MAX_DAYS:
            fail(f"--from/--to: more than {MAX_DAYS} days")
        return args.first, args.last
    yesterday = day_of(time.time(), timezone(args, settings)) - dt.timedelta(days=1)
    return yesterday, yesterday


def timezone(args: argparse.Namespace, settings: RollupSettings) -> str:
    from airflow_ett.rollup.calendar import CalendarError, check_tz

    tz = args.tz or settings.timezone
    try:
        return check_tz(tz)
    except CalendarError as exc:
        fail(f"--tz: {exc}")


def add_parser(sub: Subcommands) -> None:
    parser = with_store(sub.add_parser(
        "rollup", help="compute and store the fleet's daily rollups",
        description="Roll the ETT store's jobs up into one row set per day (the fleet, each "
                    "tenant, model and owning team), replacing the days' old rows. What the "
                    "nightly DAG ett_fleet_rollup runs."))
    add_day_options(parser)
    parser.set_defaults(func=rollup_command)


@store_command
def rollup_command(args: argparse.Namespace) -> int:
    from airflow_ett.console import progress
    from airflow_ett.rollup import ComponentsError, load_components, windows
    from airflow_ett.settings import RollupSettings
    from airflow_ett.store import EttStore

    settings = RollupSettings.load()
    first, last = day_range(args, settings)
    tz = timezone(args, settings)
    try:
        components = load_components(settings.components_file)
    except ComponentsError as exc:
        fail(str(exc))
    count = (last - first).days + 1
    with EttStore(store_url(args)) as store, progress(count, "rollup days") as advance:
        rollups = store.daily.compute(windows(first, last, tz), components, now=time.time(),
                                      cut_pct=settings.whatif_cut_pct,
                                      start_s=settings.whatif_start_s,
                                      silent_after_s=settings.silent_after_s, advance=advance)
    for r in rollups:
        note = "   provisional" if r.provisional else ""
        if r.silent_jobs:
            note += f"   {r.silent_jobs} silent job(s) cut"
        ett = "none" if r.fleet.ett_pct is None else f"{r.fleet.ett_pct:.1f}"
        print(f"{r.day} ({r.tz}): fleet ETT% {ett}   jobs {r.fleet.jobs}   "
              f"GPU-h {r.fleet.gpu_hours:,.2f}   lost {r.fleet.gpu_hours_lost:,.2f}{note}")
    sys.stdout.flush()
    return 0
