"""`airflow-ett`: compute, store and inspect ETT breakdowns from the shell.

One module per command group (`compute`, `ingest`, `db`, `runs`, `rollup`, `report`,
`spool`, `embedded`, `fleet`, `tenants`, `preemption`, `simulate_preemption`), each
adding its parsers and holding its commands; `common` is what they share, `events_file`
reads event logs, `render` writes a job's report as text. This package module only
assembles the parser and maps errors to exit statuses, and `main` here is
the console script's target (`airflow_ett.cli:main`).

Bad input is one clear line on stderr and a non-zero exit, never a traceback: exit 1 for
input or runtime problems (a bad file, an unreachable store, a place a file cannot be
written), 2 for usage errors (argparse's own convention: an unknown option, a value of
the wrong form or out of its range). Every error line goes through `console.terminal_text`,
as everything printed does, so a name or path in it cannot drive the terminal. An
`OSError` no command turned into its own message (a file system's refusal) is such a line
too, naming the path. Bad lines in an events file are the exception (see
`events_file`). Imports stay inside commands, and the store's and the harness's errors
are caught by the commands that reach them, so that `compute` on a laptop needs neither
SQLAlchemy nor Airflow loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

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


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (which quote what was typed: an unrecognised
    argument, a bad value) are escaped for the terminal like every other line. Its
    subcommands' parsers are of this class too (argparse makes them of the parent's)."""

    def error(self, message: str) -> NoReturn:
        from airflow_ett.console import terminal_text

        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {terminal_text(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        _error(str(exc), getattr(exc, "detail", ()))
        return 1
    except BrokenPipeError:  # `airflow-ett compute ... | head`
        return 0
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # the file system said no where no command expected it
        where = f"{exc.filename}: " if exc.filename is not None else ""
        _error(f"{where}{exc.strerror or exc}")
        return 1


def _error(message: str, detail: Sequence[str] = ()) -> None:
    """`airflow-ett: error: <message>` on one line, then `detail` indented under it."""
    from airflow_ett.console import terminal_text

    lines = [f"airflow-ett: error: {terminal_text(message)}"]
    lines += [f"  {terminal_text(text)}" for text in detail]
    sys.stderr.write("\n".join(lines) + "\n")
