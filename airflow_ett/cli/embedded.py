"""`airflow-ett embedded`: a local Airflow (SQLite, LocalExecutor) run as child processes,
to run one DAG (`make demo`) or to keep the UI up (`make ui`).

The harness itself is `airflow_ett.embedded`; this module turns its results into what a
person reads in a terminal. Neither imports Airflow: the components do, in their own
processes, with the `AIRFLOW_HOME` chosen here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_ett.cli.common import fail, port, positive_seconds, user_errors

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands
    from airflow_ett.embedded import EmbeddedAirflow, RunResult


def add_parser(sub: Subcommands) -> None:
    embedded = sub.add_parser(
        "embedded", help="a local Airflow (SQLite, LocalExecutor) run as child processes"
    ).add_subparsers(dest="embedded_command", required=True, metavar="ACTION")

    def with_airflow(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--home", help="AIRFLOW_HOME (default: $AIRFLOW_HOME, else ./airflow_home)")
        p.add_argument("--dags-folder", help="default: the repository's dags/")
        return p

    run = with_airflow(embedded.add_parser(
        "run", help="start Airflow, trigger a DAG, wait for the run, stop Airflow"))
    run.add_argument("dag_id")
    run.add_argument("--conf", help="the run's conf, a JSON object")
    run.add_argument("--timeout", type=positive_seconds, default=600.0,
                     help="seconds to wait for the run (default: 600)")
    run.add_argument("--port", type=port, help="API/UI port on 127.0.0.1 (default: a free one)")
    run.add_argument("--keep-running", action="store_true",
                     help="after the run, keep Airflow (and the UI) up until Ctrl-C")
    run.set_defaults(func=run_command)
    ui = with_airflow(embedded.add_parser("ui", help="start Airflow and its UI until Ctrl-C"))
    ui.add_argument("--port", type=port, default=8080, help="on 127.0.0.1 (default: 8080)")
    ui.set_defaults(func=ui_command)


def _embedded_error() -> type[Exception]:
    from airflow_ett.embedded import EmbeddedAirflowError

    return EmbeddedAirflowError


# A component that died, a DAG that failed to import, a run past its timeout: one line
# (with the log lines the message carries), exit 1.
_embedded_command = user_errors(_embedded_error, with_detail=True)


def _default_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or "airflow_home")


def _default_dags_folder() -> Path | None:
    """The repository's dags/: present in a checkout, absent from an installed wheel."""
    import airflow_ett

    folder = Path(airflow_ett.__file__).resolve().parent.parent / "dags"
    return folder if folder.is_dir() else None


def _embedded(args: argparse.Namespace, api_port: int | None) -> EmbeddedAirflow:
    from airflow_ett.embedded import EmbeddedAirflow

    dags_folder = args.dags_folder or _default_dags_folder()
    if dags_folder is None:
        fail("no dags/ folder next to the airflow_ett package: pass --dags-folder DIR")
    if not Path(dags_folder).is_dir():
        fail(f"dags folder not found: {dags_folder}")
    return EmbeddedAirflow(home=Path(args.home or _default_home()), dags_folder=Path(dags_folder),
                           api_port=api_port)


def _progress(message: str) -> None:
    """A step of the harness, on stderr (stdout is the run's report): the same plain line
    as ever in a log or a pipe, the prefix styled on a terminal."""
    from airflow_ett import console

    console.line(console.Text.assemble(("airflow-ett:", "bold cyan"), " ", message),
                 file=sys.stderr, flush=True)


def _print_run(result: RunResult, airflow: EmbeddedAirflow) -> None:
    from airflow_ett.console import line

    line(f"run {result.run_id} of {result.dag_id}: {result.state} "
         f"({result.trigger_to_end_s:.1f} s from trigger to end)")
    tasks = result.task_instances
    width = max([len("task"), *(len(str(t["task_id"])) for t in tasks)])
    line(f"  {'task':<{width}}  {'try':>3}  {'state':<16} duration")
    for t in tasks:
        duration = f"{t['duration']:.1f} s" if isinstance(t["duration"], int | float) else "-"
        line(f"  {t['task_id']:<{width}}  {t['try_number']:>3}  {t['state'] or '-':<16} "
             f"{duration}")
    for t in tasks:
        if t["state"] not in ("success", "skipped", None):
            log = airflow.task_log_path(result.dag_id, result.run_id, t["task_id"],
                                        t["try_number"], t["map_index"])
            if log.is_file():
                line(f"  log of {t['task_id']}: {log}")


def _print_ett(airflow: EmbeddedAirflow, result: RunResult) -> None:
    """The run's ETT report, from the store the components wrote to (their [ett] config)."""
    from airflow_ett.jobs import job_id_for

    job = job_id_for(result.dag_id, result.run_id)
    shown = airflow.ett("runs", "show", job)
    print()
    if shown.returncode == 0:
        print(shown.stdout.rstrip())
    else:
        print(f"no ETT report for {job}: {shown.stderr.strip() or shown.stdout.strip()}")


@_embedded_command
def run_command(args: argparse.Namespace) -> int:
    from airflow_ett.embedded import (
        login_info,
        run_dag,
        serve_until_interrupted,
        terminate_as_interrupt,
    )

    conf: dict[str, Any] = {}
    if args.conf is not None:
        try:
            conf = json.loads(args.conf)
        except ValueError as exc:
            fail(f"--conf is not JSON: {exc}")
        if not isinstance(conf, dict):
            fail("--conf must be a JSON object, e.g. '{\"epochs\": 2}'")
    with terminate_as_interrupt(), _embedded(args, args.port) as airflow:
        result = run_dag(airflow, args.dag_id, conf=conf, timeout=args.timeout,
                         progress=_progress)
        _print_run(result, airflow)
        _print_ett(airflow, result)
        if args.keep_running:
            print(login_info(airflow.home, airflow.api_url))
            _progress("components keep running; Ctrl-C stops them")
            serve_until_interrupted(airflow)
        _progress("stopping Airflow")
    return 0 if result.succeeded else 1


@_embedded_command
def ui_command(args: argparse.Namespace) -> int:
    import socket

    from airflow_ett.embedded import login_info, serve_until_interrupted, terminate_as_interrupt

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", args.port))
        except OSError:
            fail(f"port {args.port} on 127.0.0.1 is in use: pass --port")
    with terminate_as_interrupt(), _embedded(args, args.port) as airflow:
        _progress(f"migrating the metadata DB in {airflow.home}")
        airflow.migrate()
        _progress(f"starting Airflow (logs: {airflow.log_dir})")
        airflow.start()
        airflow.wait_until_ready(timeout=180.0)
        print(login_info(airflow.home, airflow.api_url), flush=True)
        _progress(f"DAGs from {airflow.dags_folder}; Ctrl-C stops everything")
        serve_until_interrupted(airflow)
        _progress("stopping Airflow")
    return 0
