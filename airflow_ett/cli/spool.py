"""`airflow-ett spool`: events waiting in the local spool, delivered to the store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_ett.cli.common import store_command, store_url, with_store

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    spool = sub.add_parser("spool", help="events waiting in the local spool").add_subparsers(
        dest="spool_command", required=True, metavar="ACTION")
    replay = with_store(spool.add_parser("replay", help="deliver spooled events to the store"))
    replay.add_argument("--spool-dir", help="default: [ett] spool_dir")
    replay.set_defaults(func=replay_command)


@store_command
def replay_command(args: argparse.Namespace) -> int:
    from airflow_ett.console import line
    from airflow_ett.emit import replay_spool
    from airflow_ett.settings import EttSettings

    spool_dir = args.spool_dir or str(EttSettings.load().spool_dir)
    if not Path(spool_dir).is_dir():
        line(f"nothing to replay: {spool_dir} does not exist")
        return 0
    result = replay_spool(store_url(args), spool_dir)
    line(f"replayed {result.replayed} event(s) from {result.files} file(s) in {spool_dir}")
    for error in result.errors:  # they quote spool files' names and lines: escaped
        line(f"airflow-ett: {error}", file=sys.stderr)
    return 1 if result.errors else 0
