"""`airflow-ett`: compute, store and inspect ETT breakdowns from the shell.

One module per command group (`compute`, `ingest`, `db`, `runs`, `rollup`, `report`,
`spool`, `embedded`, `fleet`, `tenants`, `preemption`, `simulate_preemption`), each
adding its parsers and holding its commands; `common` is what they share, `events_file`
reads event logs, `render` writes a job's report as text. This package module only
assembles the parser and maps errors to exit statuses, and `main` here is
the console script's target (`airflow_ett.cli:main`).

Bad input is one clear line on stderr and a non-zero exit, never a traceback: exit 1 for
input or runtime problems (a bad file, an unreachable store), 2 for usage errors
(argparse's own convention). Bad lines in an events file are the exception (see
`events_file`). Imports stay inside commands, and the store's and the harness's errors
are caught by the commands that reach them, so that `compute` on a laptop needs neither
SQLAlchemy nor Airflow loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_ett.cli import (
    compute,
    db,
    embedded,
    fleet,
    ingest,
    preemption,
    report,
    rollup,
    runs,
    simulate_preemption,
    spool,
    tenants,
)
from airflow_ett.cli.common import CliError

__all__ = ["build_parser", "main"]


def _version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("airflow-ett")
    except PackageNotFoundError:  # pragma: no cover - only in an uninstalled source tree
        import airflow_ett

        return airflow_ett.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-ett",
        description="Effective Training Time: where a training job's wall time went.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (compute, ingest, db, runs, rollup, report, spool, embedded, fleet, tenants,
                  preemption, simulate_preemption):
        group.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from airflow_ett.settings import SettingsError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CliError, SettingsError) as exc:
        print(f"airflow-ett: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `airflow-ett compute ... | head`
        return 0
    except KeyboardInterrupt:
        return 130
