"""`airflow-ett report`: the morning report of stored rollups, as a terminal table, JSON,
CSV or HTML with charts (the nightly DAG writes the same files: `report.files`)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_ett.cli.common import fail, name_arg, store_command, store_url, with_store
from airflow_ett.cli.rollup import add_day_options, day_range

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands
    from airflow_ett.rollup import DayRollup
    from airflow_ett.rollup.compare import WindowParts
    from airflow_ett.store import EttStore


def add_parser(sub: Subcommands) -> None:
    parser = with_store(sub.add_parser(
        "report", help="the fleet's ETT report from stored rollups",
        description="The morning report: fleet ETT% and its change, components with owners "
                    "and SLOs, failures, what-if, the worst runs. Reads the days "
                    "`airflow-ett rollup` stored."))
    add_day_options(parser)
    parser.add_argument("--tenant", type=name_arg, help="only this tenant's figures")
    parser.add_argument("--format", choices=("text", "html", "json", "csv"), default="text")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="write the report file there (html: default "
                             "[ett] report_dir/<last day>/); text/json/csv print otherwise")
    parser.add_argument("--compare", nargs=2, type=window_arg, metavar=("D1..D2", "D3..D4"),
                        help="what moved fleet ETT%% from the first window of stored days to "
                             "the second, by component, tenant and model, as operated and for "
                             "the models in both (text or json)")
    parser.set_defaults(func=report_command)


def window_arg(text: str) -> tuple[dt.date, dt.date]:
    """argparse type: a window of days, `D1..D2` (`rollup.compare.parse_window`): a usage
    error naming the value otherwise."""
    from airflow_ett.rollup.compare import WindowError, parse_window

    try:
        return parse_window(text)
    except WindowError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _stored_days(store: EttStore, first: dt.date, last: dt.date
                 ) -> tuple[list[DayRollup], DayRollup | None]:
    days = store.daily.days(first.isoformat(), last.isoformat())
    if not days:
        span = first.isoformat() if first == last else f"{first} to {last}"
        flags = f"--date {first}" if first == last else f"--from {first} --to {last}"
        fail(f"no rollup stored for {span}: run `airflow-ett rollup {flags}` first")
    before = store.daily.day((first - dt.timedelta(days=1)).isoformat())
    return days, before


@store_command
def report_command(args: argparse.Namespace) -> int:
    """`report`: the days asked for, or, with `--compare`, two windows compared."""
    return _compare(args) if args.compare is not None else _report(args)


def _report(args: argparse.Namespace) -> int:
    from airflow_ett.console import is_terminal, line, terminal_text
    from airflow_ett.report.files import FILE_NAMES, report_text, write_reports
    from airflow_ett.report.tabular import to_csv, to_json
    from airflow_ett.report.timeline import worst_timelines
    from airflow_ett.settings import RollupSettings
    from airflow_ett.store import EttStore

    settings = RollupSettings.load()
    first, last = day_range(args, settings)
    if args.format == "html" and args.tenant is not None:
        fail("--tenant: the HTML report shows the whole fleet; use --format text, json or csv "
             "for one tenant")
    with EttStore(store_url(args)) as store:
        days, before = _stored_days(store, first, last)
        if args.tenant is not None and not any(args.tenant in d.tenants for d in days):
            fail(f"--tenant: {args.tenant!r} ran no job in the days asked for")
        timelines = (worst_timelines(days[-1], store.job_events, tenant=args.tenant)
                     if args.format == "html" else [])
    out, where = args.out, "--out"
    if args.format == "html" and out is None:
        out, where = settings.report_dir / days[-1].day, "[ett] report_dir"
    if out is not None:
        try:
            written = write_reports(out, days, before, timelines, tenant=args.tenant,
                                    formats=[args.format])
        except OSError as exc:
            fail(f"{where} {out}: the report cannot be written there: {_why(out, exc)}")
        line(f"report: {written[args.format]}")
        return 0
    if args.format == "json":
        sys.stdout.write(to_json(days, tenant=args.tenant))
    elif args.format == "csv":  # data for a pipe; on a terminal, shown as the rest is
        table = to_csv(days, tenant=args.tenant)
        if is_terminal():
            table = "\n".join(terminal_text(row) for row in table.split("\n"))
        sys.stdout.write(table)
    else:
        text = report_text(days, before, tenant=args.tenant, terminal=is_terminal())
        sys.stdout.write(text + "\n")
        html = settings.report_dir / days[-1].day / FILE_NAMES["html"]
        if html.is_file():
            line(f"report: {html}")
    return 0


def _window(store: EttStore, days: tuple[dt.date, dt.date]) -> WindowParts:
    """The window's parts, every day of it stored, or one line naming the window and
    the days missing."""
    from airflow_ett.rollup.compare import WindowError, window

    first, last = days
    try:
        return window(first, last, store.daily.window_parts(first.isoformat(),
                                                            last.isoformat()))
    except WindowError as exc:
        fail(f"--compare: {exc}")


def _compare(args: argparse.Namespace) -> int:
    """`report --compare A B`: the comparison of window B against window A."""
    import msgspec

    from airflow_ett.console import is_terminal
    from airflow_ett.report.compare import compare_text
    from airflow_ett.rollup.compare import compare
    from airflow_ett.store import EttStore

    for option, value in (("--date", args.date), ("--from", args.first), ("--to", args.last),
                          ("--tz", args.tz), ("--tenant", args.tenant), ("--out", args.out)):
        if value is not None:
            fail(f"{option}: not with --compare, which names its own days and shows the "
                 "whole fleet")
    if args.format not in ("text", "json"):
        fail(f"--format: {args.format!r} is not a --compare format: text or json")
    with EttStore(store_url(args)) as store:
        before, after = (_window(store, w) for w in args.compare)
    result = compare(before, after)
    if args.format == "json":
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result).decode(), indent=2)
                         + "\n")
    else:
        sys.stdout.write(compare_text(result, terminal=is_terminal()) + "\n")
    return 0


def _why(out: Path, exc: OSError) -> str:
    """What stopped the write, said of the place asked for (the OS says 'File exists' of a
    file where the report's directory should be)."""
    if isinstance(exc, FileExistsError | NotADirectoryError):
        for path in (out, *out.parents):
            if path.exists() and not path.is_dir():
                return f"{path} is not a directory"
    where = f" ({exc.filename})" if exc.filename not in (None, str(out)) else ""
    return f"{(exc.strerror or str(exc)).lower()}{where}"

