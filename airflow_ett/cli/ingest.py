"""`airflow-ett ingest`: store an event log (e.g. from your own trainer); idempotent."""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import TYPE_CHECKING, Final

from airflow_ett.cli.common import store_command, store_url, with_store
from airflow_ett.cli.events_file import BadLines, check_strict, events_source, iter_events

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    ingest = with_store(sub.add_parser(
        "ingest", help="store an event log (e.g. from your own trainer); idempotent"))
    ingest.add_argument("events", help="events file, one JSON object per line ('-': stdin)")
    ingest.add_argument("--strict", action="store_true", help="store nothing if a line is bad")
    ingest.set_defaults(func=ingest_command)


#: Events stored per transaction: memory stays flat at any file size, and a batch is a
#: few MB of rows (larger batches were no faster on SQLite or PostgreSQL).
BATCH: Final = 5000


@store_command
def ingest_command(args: argparse.Namespace) -> int:
    from airflow_ett.store import EttStore

    source = args.events
    new = duplicates = conflicts = read = 0
    jobs: set[str] = set()
    with events_source(source) as fh:
        if args.strict:
            check_strict(fh, source)  # nothing stored when a line is bad
        bad = BadLines(source)
        with EttStore(store_url(args)) as store:
            events = (e for _, e in iter_events(fh, bad))
            while batch := list(itertools.islice(events, BATCH)):
                result = store.ingest(batch)
                new, duplicates = new + result.new, duplicates + result.duplicates
                conflicts += result.conflicts
                read += len(batch)
                jobs.update(e.job for e in batch)
    bad.report(strict=args.strict)
    print(f"stored {new} new event(s) of {read} read ({duplicates} already there) for "
          f"{len(jobs)} job(s)")
    if conflicts:
        # As `compute` warns: the stored version stands, the differing one is not stored.
        print(f"airflow-ett: warning: {conflicts} event id(s) reused with different "
              "content (the version stored first stands)", file=sys.stderr)
    return 0
