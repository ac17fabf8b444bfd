"""`airflow-ett`: compute, store and inspect ETT breakdowns from the shell.

Bad input is one clear line on stderr and a non-zero exit, never a traceback: exit 1 for
input or runtime problems (a bad file, an unreachable store), 2 for usage errors
(argparse's own convention). Bad lines in an events file are the exception: each is
reported on stderr and skipped, the good ones are used and the exit is 0, with a count of
what was skipped; `--strict` turns any bad line into exit 1 (and `ingest` then stores
nothing). Imports stay inside commands so that `compute` on a laptop needs neither
SQLAlchemy nor Airflow loaded.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, NoReturn, TextIO

if TYPE_CHECKING:
    from airflow_ett.embedded import EmbeddedAirflow, RunResult

MAX_REPORTED_ERRORS = 20


class CliError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


def _fail(message: str) -> NoReturn:
    raise CliError(message)


def _time_arg(text: str) -> float:
    """Unix seconds or an ISO-8601 date/time (UTC when no zone is given)."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise argparse.ArgumentTypeError(f"not a time: {text!r} (a finite number of "
                                             "Unix seconds, or ISO-8601)")
        return seconds
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (use Unix seconds or ISO-8601, e.g. 2026-11-28T10:00Z)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (`--limit -1` must not mean "all" on SQLite and
    a database error on PostgreSQL)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {text!r}")
    return value


def _version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("airflow-ett")
    except PackageNotFoundError:  # pragma: no cover - only in an uninstalled source tree
        import airflow_ett

        return airflow_ett.__version__


def utc_text(ts: object) -> str:
    """A stored Unix time as `YYYY-mm-dd HH:MM:SS` (UTC), or as the raw value when it is
    no representable time (NaN, out of datetime's range, not a number): a listing shows
    an odd row as it is instead of failing for every row."""
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(float(ts), UTC).strftime(  # type: ignore[arg-type]
            "%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError, TypeError):
        return repr(ts) if isinstance(ts, str) else str(ts)


def _json_safe(value: Any) -> Any:
    """NaN and infinities as strings: `json.dump` would write them as bare NaN/Infinity,
    which is not JSON and breaks the reader of `--json` output."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _print_json(obj: Any, out: TextIO) -> None:
    json.dump(_json_safe(obj), out, indent=2, sort_keys=False, allow_nan=False)
    out.write("\n")


# --- compute ---------------------------------------------------------------------------


_NOT_UTF8: Final = {codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16",
                    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",
                    b"\x1f\x8b": "gzip-compressed"}


def _event_lines(fh: BinaryIO, source: str) -> Iterator[bytes]:
    """The lines of a binary stream, a UTF-8 BOM removed from the first.

    Bytes, not text: a line that is not UTF-8 is then one bad line (named by number)
    rather than a decode error that ends the whole read. A BOM (Windows editors write
    one) would otherwise make line 1 invalid JSON. UTF-16/32 and gzip are told at once,
    since every line of them would be bad.
    """
    first = True
    for line in fh:
        if first:
            first = False
            for magic, kind in _NOT_UTF8.items():
                # UTF-32-LE's BOM starts with UTF-16-LE's: the dict lists UTF-16 first,
                # and both answers say the same thing ("not UTF-8").
                if line.startswith(magic):
                    _fail(f"events file {source} is {kind}, not UTF-8 JSON Lines text")
            if line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8):]
        yield line


def _open_events(source: str) -> BinaryIO:
    """The events file opened for reading, or one line saying why it cannot be."""
    try:
        return open(source, "rb")
    except FileNotFoundError:
        _fail(f"events file not found: {source}")
    except IsADirectoryError:
        _fail(f"events file {source} is a directory, not a file")
    except PermissionError:
        _fail(f"cannot read events file {source}: permission denied")
    except OSError as exc:
        _fail(f"cannot read events file {source}: {exc.strerror or exc}")


def _read_events(source: str, *, strict: bool) -> list[Any]:
    """Parse an events file (or stdin), report bad lines on stderr, keep the good ones."""
    from airflow_ett.ett.events import parse_lines

    try:
        if source == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            if stdin is not None:
                parsed = parse_lines(_event_lines(stdin, "on standard input"))
            else:  # a text stream without bytes underneath (tests, embedding)
                parsed = parse_lines(line.removeprefix("\ufeff") if n == 0 else line
                                     for n, line in enumerate(sys.stdin))
        else:
            with _open_events(source) as fh:
                parsed = parse_lines(_event_lines(fh, source))
    except OSError as exc:  # a read error mid-file (EIO, a vanished network mount)
        _fail(f"cannot read events file {source}: {exc.strerror or exc}")
    for error in parsed.errors[:MAX_REPORTED_ERRORS]:
        print(f"airflow-ett: skipped {source}: {error}", file=sys.stderr)
    if len(parsed.errors) > MAX_REPORTED_ERRORS:
        print(f"airflow-ett: ... and {len(parsed.errors) - MAX_REPORTED_ERRORS} more bad "
              "lines", file=sys.stderr)
    if strict and parsed.errors:
        _fail(f"{len(parsed.errors)} bad line(s) in {source} (--strict)")
    if not parsed.events:
        _fail(f"no valid events in {source}")
    if parsed.errors:
        print(f"airflow-ett: warning: skipped {len(parsed.errors)} bad line(s) of "
              f"{len(parsed.errors) + len(parsed.events)} in {source}; used the "
              f"{len(parsed.events)} good one(s) (--strict fails instead)", file=sys.stderr)
    return list(parsed.events)


def _cmd_compute(args: argparse.Namespace) -> int:
    from airflow_ett.ett.attribution import attribute
    from airflow_ett.report_text import render_job

    source = args.events
    events = _read_events(source, strict=args.strict)
    results = attribute(events, now=args.now)
    if args.job is not None:
        if args.job not in results:
            _fail(f"job {args.job!r} is not in {source}; jobs there: {sorted(results)[:10]}")
        results = {args.job: results[args.job]}
    dicts = [r.to_dict(include_timeline=args.timeline) for r in results.values()]
    if args.json:
        _print_json(dicts[0] if len(dicts) == 1 else dicts, sys.stdout)
    else:
        print("\n\n".join(render_job(d) for d in dicts))
    return 0


# --- store-backed commands ---------------------------------------------------------------


def _store_url(args: argparse.Namespace) -> str:
    if args.store_url:
        return str(args.store_url)
    from airflow_ett.settings import EttSettings

    return EttSettings.load().store_url


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from airflow_ett.store import current, mask_url, upgrade

    url = _store_url(args)
    upgrade(url)
    print(f"ETT store at {mask_url(url)} is at revision {current(url)}")
    return 0


def _cmd_ingest(args: argparse.Namespace) -> int:
    from airflow_ett.store import EttStore

    events = _read_events(args.events, strict=args.strict)
    with EttStore(_store_url(args)) as store:
        result = store.ingest(events)
    jobs = len({e.job for e in events})
    print(f"stored {result.new} new event(s) of {len(events)} read ({result.duplicates} "
          f"already there) for {jobs} job(s)")
    if result.conflicts:
        # As `compute` warns: the stored version stands, the differing one is not stored.
        print(f"airflow-ett: warning: {result.conflicts} event id(s) reused with different "
              "content (the version stored first stands)", file=sys.stderr)
    return 0


def _cmd_runs_list(args: argparse.Namespace) -> int:
    from airflow_ett.store import EttStore

    with EttStore(_store_url(args)) as store:
        rows = store.list_runs(since=args.since, until=args.until, tenant=args.tenant,
                               model=args.model, dag_id=args.dag_id, limit=args.limit)
    if args.json:
        _print_json([dataclasses.asdict(row) for row in rows], sys.stdout)
        return 0
    if not rows:
        print("no runs match")
        return 0
    width = max(len("job"), *(len(row.job) for row in rows))
    print(f"{'job':<{width}}  {'tenant':<16} {'model':<16} {'submitted (UTC)':<20} status")
    for row in rows:
        submitted = utc_text(row.submitted_ts)
        print(f"{row.job:<{width}}  {row.tenant or '-':<16} {row.model or '-':<16} "
              f"{submitted:<20} {row.status}")
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:
    from airflow_ett.report_text import render_job
    from airflow_ett.store import EttStore, JobNotFound

    with EttStore(_store_url(args)) as store:
        try:
            summary = store.summary(args.run, now=args.now)
        except JobNotFound:
            _fail(f"no run {args.run!r} in the ETT store")
    if args.json:
        _print_json(summary, sys.stdout)
    else:
        print(render_job(summary))
    return 0


def _cmd_spool_replay(args: argparse.Namespace) -> int:
    from airflow_ett.emit import replay_spool
    from airflow_ett.settings import EttSettings

    spool_dir = args.spool_dir or str(EttSettings.load().spool_dir)
    if not Path(spool_dir).is_dir():
        print(f"nothing to replay: {spool_dir} does not exist")
        return 0
    result = replay_spool(_store_url(args), spool_dir)
    print(f"replayed {result.replayed} event(s) from {result.files} file(s) in {spool_dir}")
    for error in result.errors:
        print(f"airflow-ett: {error}", file=sys.stderr)
    return 1 if result.errors else 0


# --- embedded Airflow ---------------------------------------------------------------------


def _default_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or "airflow_home")


def _default_dags_folder() -> Path | None:
    """The repository's dags/: present in a checkout, absent from an installed wheel."""
    import airflow_ett

    folder = Path(airflow_ett.__file__).resolve().parent.parent / "dags"
    return folder if folder.is_dir() else None


def _embedded(args: argparse.Namespace, port: int | None) -> EmbeddedAirflow:
    from airflow_ett.embedded import EmbeddedAirflow

    dags_folder = args.dags_folder or _default_dags_folder()
    if dags_folder is None:
        _fail("no dags/ folder next to the airflow_ett package: pass --dags-folder DIR")
    if not Path(dags_folder).is_dir():
        _fail(f"dags folder not found: {dags_folder}")
    return EmbeddedAirflow(home=Path(args.home or _default_home()), dags_folder=Path(dags_folder),
                           api_port=port)


def _progress(message: str) -> None:
    print(f"airflow-ett: {message}", file=sys.stderr, flush=True)


def _print_run(result: RunResult, airflow: EmbeddedAirflow) -> None:
    print(f"run {result.run_id} of {result.dag_id}: {result.state} "
          f"({result.trigger_to_end_s:.1f} s from trigger to end)")
    tasks = result.task_instances
    width = max([len("task"), *(len(str(t["task_id"])) for t in tasks)])
    print(f"  {'task':<{width}}  {'try':>3}  {'state':<16} duration")
    for t in tasks:
        duration = f"{t['duration']:.1f} s" if isinstance(t["duration"], int | float) else "-"
        print(f"  {t['task_id']:<{width}}  {t['try_number']:>3}  {t['state'] or '-':<16} "
              f"{duration}")
    for t in tasks:
        if t["state"] not in ("success", "skipped", None):
            log = airflow.task_log_path(result.dag_id, result.run_id, t["task_id"],
                                        t["try_number"], t["map_index"])
            if log.is_file():
                print(f"  log of {t['task_id']}: {log}")


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


def _cmd_embedded_run(args: argparse.Namespace) -> int:
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
            _fail(f"--conf is not JSON: {exc}")
        if not isinstance(conf, dict):
            _fail("--conf must be a JSON object, e.g. '{\"epochs\": 2}'")
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


def _cmd_embedded_ui(args: argparse.Namespace) -> int:
    import socket

    from airflow_ett.embedded import login_info, serve_until_interrupted, terminate_as_interrupt

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", args.port))
        except OSError:
            _fail(f"port {args.port} on 127.0.0.1 is in use: pass --port")
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


# --- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-ett",
        description="Effective Training Time: where a training job's wall time went.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    compute = sub.add_parser("compute", help="ETT breakdown of an event log (JSON Lines)")
    compute.add_argument("events", help="events file, one JSON object per line ('-': stdin)")
    compute.add_argument("--json", action="store_true", help="machine-readable output")
    compute.add_argument("--job", help="only this job (when the log holds several)")
    compute.add_argument("--now", type=_time_arg,
                         help="the 'now' for jobs still running (default: the clock)")
    compute.add_argument("--timeline", action="store_true",
                         help="include the labelled timeline segments in --json output")
    compute.add_argument("--strict", action="store_true", help="fail on any bad line")
    compute.set_defaults(func=_cmd_compute)

    def with_store(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--store-url", help="SQLAlchemy URL (default: [ett] store_url)")
        return p

    ingest = with_store(sub.add_parser(
        "ingest", help="store an event log (e.g. from your own trainer); idempotent"))
    ingest.add_argument("events", help="events file, one JSON object per line ('-': stdin)")
    ingest.add_argument("--strict", action="store_true", help="store nothing if a line is bad")
    ingest.set_defaults(func=_cmd_ingest)

    db = sub.add_parser("db", help="the ETT store's schema").add_subparsers(
        dest="db_command", required=True, metavar="ACTION")
    with_store(db.add_parser("upgrade", help="create or migrate the schema")).set_defaults(
        func=_cmd_db_upgrade)

    runs = sub.add_parser("runs", help="runs recorded in the ETT store").add_subparsers(
        dest="runs_command", required=True, metavar="ACTION")
    listing = with_store(runs.add_parser("list", help="runs, newest first"))
    listing.add_argument("--since", type=_time_arg, help="submitted at or after")
    listing.add_argument("--until", type=_time_arg, help="submitted before")
    listing.add_argument("--tenant")
    listing.add_argument("--model")
    listing.add_argument("--dag-id")
    listing.add_argument("--limit", type=_positive_int, default=50,
                         help="at most this many runs (default: 50)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=_cmd_runs_list)
    show = with_store(runs.add_parser("show", help="one run's ETT breakdown"))
    show.add_argument("run", help="the job id (the run's id in the store)")
    show.add_argument("--now", type=_time_arg, help="'now' for a run still going")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_cmd_runs_show)

    spool = sub.add_parser("spool", help="events waiting in the local spool").add_subparsers(
        dest="spool_command", required=True, metavar="ACTION")
    replay = with_store(spool.add_parser("replay", help="deliver spooled events to the store"))
    replay.add_argument("--spool-dir", help="default: [ett] spool_dir")
    replay.set_defaults(func=_cmd_spool_replay)

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
    run.add_argument("--timeout", type=_positive_seconds, default=600.0,
                     help="seconds to wait for the run (default: 600)")
    run.add_argument("--port", type=_port, help="API/UI port on 127.0.0.1 (default: a free one)")
    run.add_argument("--keep-running", action="store_true",
                     help="after the run, keep Airflow (and the UI) up until Ctrl-C")
    run.set_defaults(func=_cmd_embedded_run)
    ui = with_airflow(embedded.add_parser("ui", help="start Airflow and its UI until Ctrl-C"))
    ui.add_argument("--port", type=_port, default=8080, help="on 127.0.0.1 (default: 8080)")
    ui.set_defaults(func=_cmd_embedded_ui)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from airflow_ett.settings import SettingsError

    args = build_parser().parse_args(argv)
    known: tuple[type[BaseException], ...] = (CliError, SettingsError)
    try:
        from airflow_ett.store import StoreError

        known = (*known, StoreError)
    except ImportError:  # pragma: no cover - the store ships with the package
        pass
    from airflow_ett.embedded import EmbeddedAirflowError

    known = (*known, EmbeddedAirflowError)
    try:
        return int(args.func(args))
    except known as exc:
        print(f"airflow-ett: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `airflow-ett compute ... | head`
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
