"""`airflow-ett runs`: the runs recorded in the ETT store, listed or one in full."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from airflow_ett.cli.common import (
    MAX_LIMIT,
    fail,
    int_in,
    name_arg,
    print_json,
    store_command,
    store_url,
    time_arg,
    utc_text,
    with_store,
)

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    runs = sub.add_parser("runs", help="runs recorded in the ETT store").add_subparsers(
        dest="runs_command", required=True, metavar="ACTION")
    listing = with_store(runs.add_parser("list", help="runs, newest first"))
    listing.add_argument("--since", type=time_arg, help="submitted at or after")
    listing.add_argument("--until", type=time_arg, help="submitted before")
    listing.add_argument("--tenant", type=name_arg)
    listing.add_argument("--model", type=name_arg)
    listing.add_argument("--dag-id", type=name_arg)
    listing.add_argument("--limit", type=int_in(1, MAX_LIMIT), default=50,
                         help="at most this many runs (default: 50)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_command)
    show = with_store(runs.add_parser("show", help="one run's ETT breakdown"))
    show.add_argument("run", type=name_arg, help="the job id (the run's id in the store)")
    show.add_argument("--now", type=time_arg, help="'now' for a run still going")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=show_command)


@store_command
def list_command(args: argparse.Namespace) -> int:
    from airflow_ett.store import EttStore

    with EttStore(store_url(args)) as store:
        rows = store.list_runs(since=args.since, until=args.until, tenant=args.tenant,
                               model=args.model, dag_id=args.dag_id, limit=args.limit)
    if args.json:
        print_json([dataclasses.asdict(row) for row in rows], sys.stdout)
        return 0
    if not rows:
        print("no runs match")
        return 0
    from airflow_ett import console

    terminal = console.is_terminal()
    console.emit(console.table(
        ["job", "tenant", "model", "submitted (UTC)", "status"],
        [(row.job, row.tenant or "-", row.model or "-", utc_text(row.submitted_ts),
          console.Text(str(row.status), style=_STATUS_STYLES.get(str(row.status), "")))
         for row in rows],
        terminal=terminal))
    return 0


# On a terminal, a run's status in the colour a reader looks for (off one: plain words).
_STATUS_STYLES = {"success": "green", "failed": "bold red", "cancelled": "red",
                  "running": "yellow"}


@store_command
def show_command(args: argparse.Namespace) -> int:
    from airflow_ett import console
    from airflow_ett.cli.render import job_view
    from airflow_ett.ett.summary import JobSummary, SummaryError
    from airflow_ett.store import EttStore, JobNotFound

    with EttStore(store_url(args)) as store:
        try:
            row = store.summary(args.run, now=args.now)
        except JobNotFound:
            fail(f"no run {args.run!r} in the ETT store")
    if args.json:  # the row as stored: what was measured, not what today's code would say
        print_json(row, sys.stdout)
        return 0
    try:
        shown = JobSummary.from_dict(row).to_dict()
    except SummaryError:  # an older version's row: shown as it is, odd values and all
        shown = row
    console.emit(job_view(shown, terminal=console.is_terminal()))
    return 0
