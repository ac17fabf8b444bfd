"""`airflow-ett compute`: the ETT breakdown of an event log, with no store and no Airflow.

Only the pure model (`airflow_ett.ett`) is imported, and only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from array import array
from typing import TYPE_CHECKING

from airflow_ett.cli.common import fail, print_json, time_arg
from airflow_ett.cli.events_file import BadLines, check_strict, event_at, events_source, iter_events

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
    from airflow_ett import console
    from airflow_ett.cli.render import job_view
    from airflow_ett.ett.attribution import attribute_job

    source = args.events
    with events_source(source) as fh:
        if args.strict:
            check_strict(fh, source)
        bad = BadLines(source)
        offsets: dict[str, array[int]] = {}  # 8 bytes per event: the file stays on disk
        for offset, event in iter_events(fh, bad):
            offsets.setdefault(event.job, array("q")).append(offset)
        bad.report(strict=args.strict)
        jobs = sorted(offsets)
        if args.job is not None:
            if args.job not in offsets:
                fail(f"job {args.job!r} is not in {source}; jobs there: {jobs[:10]}")
            jobs = [args.job]
        terminal = console.is_terminal()
        dicts = []
        for i, job in enumerate(jobs):  # one job's events in memory at a time
            result = attribute_job([event_at(fh, at) for at in offsets.pop(job)],
                                   now=args.now)
            if args.json:
                dicts.append(result.to_dict(include_timeline=args.timeline))
            else:  # one blank line between jobs
                view = job_view(result.summary().to_dict(), terminal=terminal)
                console.emit(*([console.Text()] if i else []), view)
    if args.json:
        print_json(dicts[0] if len(dicts) == 1 else dicts, sys.stdout)
    return 0
