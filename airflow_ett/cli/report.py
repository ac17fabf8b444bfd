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
    parser.set_defaults(func=report_command)


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


def _why(out: Path, exc: OSError) -> str:
    """What stopped the write, said of the place asked for (the OS says 'File exists' of a
    file where the report's directory should be)."""
    if isinstance(exc, FileExistsError | NotADirectoryError):
        for path in (out, *out.parents):
            if path.exists() and not path.is_dir():
                return f"{path} is not a directory"
    where = f" ({exc.filename})" if exc.filename not in (None, str(out)) else ""
    return f"{(exc.strerror or str(exc)).lower()}{where}"

