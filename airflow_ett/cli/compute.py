"""`airflow-ett compute`: the ETT breakdown of an event log, with no store and no Airflow.

Only the pure model (`airflow_ett.ett`) is imported, and only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from airflow_ett.cli.common import fail, print_json, time_arg
from airflow_ett.cli.events_file import read_events

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    compute = sub.add_parser("compute", help="ETT breakdown of an event log (JSON Lines)")
    compute.add_argument("events", help="events file, one JSON object per line ('-': stdin)")
    compute.add_argument("--json", action="store_true", help="machine-readable output")
    compute.add_argument("--job", help="only this job (when the log holds several)")
    compute.add_argument("--now", type=time_arg,
                         help="the 'now' for jobs still running (default: the clock)")
    compute.add_argument("--timeline", action="store_true",
                         help="include the labelled timeline segments in --json output")
    compute.add_argument("--strict", action="store_true", help="fail on any bad line")
    compute.set_defaults(func=compute_command)


def compute_command(args: argparse.Namespace) -> int:
    from airflow_ett.cli import console
    from airflow_ett.cli.render import job_view
    from airflow_ett.ett.attribution import attribute

    source = args.events
    events = read_events(source, strict=args.strict)
    results = attribute(events, now=args.now)
    if args.job is not None:
        if args.job not in results:
            fail(f"job {args.job!r} is not in {source}; jobs there: {sorted(results)[:10]}")
        results = {args.job: results[args.job]}
    if args.json:
        dicts = [r.to_dict(include_timeline=args.timeline) for r in results.values()]
        print_json(dicts[0] if len(dicts) == 1 else dicts, sys.stdout)
    else:
        terminal = console.is_terminal()
        views = [job_view(r.summary().to_dict(), terminal=terminal) for r in results.values()]
        for i, view in enumerate(views):  # one blank line between jobs
            console.emit(*([console.Text()] if i else []), view)
    return 0
