"""`airflow-ett ingest`: store an event log (e.g. from your own trainer); idempotent."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from airflow_ett.cli.common import store_command, store_url, with_store
from airflow_ett.cli.events_file import read_events

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    ingest = with_store(sub.add_parser(
        "ingest", help="store an event log (e.g. from your own trainer); idempotent"))
    ingest.add_argument("events", help="events file, one JSON object per line ('-': stdin)")
    ingest.add_argument("--strict", action="store_true", help="store nothing if a line is bad")
    ingest.set_defaults(func=ingest_command)


@store_command
def ingest_command(args: argparse.Namespace) -> int:
    from airflow_ett.store import EttStore

    events = read_events(args.events, strict=args.strict)
    with EttStore(store_url(args)) as store:
        result = store.ingest(events)
    jobs = len({e.job for e in events})
    print(f"stored {result.new} new event(s) of {len(events)} read ({result.duplicates} "
          f"already there) for {jobs} job(s)")
    if result.conflicts:
        # As `compute` warns: the stored version stands, the differing one is not stored.
        print(f"airflow-ett: warning: {result.conflicts} event id(s) reused with different "
              "content (the version stored first stands)", file=sys.stderr)
    return 0
