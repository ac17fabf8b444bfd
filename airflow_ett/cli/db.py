"""`airflow-ett db`: the ETT store's schema."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from airflow_ett.cli.common import store_command, store_url, with_store

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    db = sub.add_parser("db", help="the ETT store's schema").add_subparsers(
        dest="db_command", required=True, metavar="ACTION")
    with_store(db.add_parser("upgrade", help="create or migrate the schema")).set_defaults(
        func=upgrade_command)


@store_command
def upgrade_command(args: argparse.Namespace) -> int:
    from airflow_ett.console import line
    from airflow_ett.store import current, mask_url, upgrade

    url = store_url(args)
    upgrade(url)
    line(f"ETT store at {mask_url(url)} is at revision {current(url)}")
    return 0
