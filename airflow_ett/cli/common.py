"""What every command group of `airflow-ett` shares: the one-line error, argument types,
time and JSON output, and the `--store-url` option.

Nothing here imports SQLAlchemy or Airflow at module level: `compute` must run on a
laptop with neither loaded. The store is imported by `store_command`, when a command that
needs it runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

Command = Callable[[argparse.Namespace], int]
if TYPE_CHECKING:
    # What `add_subparsers()` returns: each command group adds its parsers to one.
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


class CliError(Exception):
    """A failure the user can act on: printed as one line, exit status 1.

    `detail`: lines printed under it, indented (the log tail a failed component left);
    the message itself is one line whatever it holds (`main` escapes a newline in it)."""

    def __init__(self, message: str, detail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.detail = detail


def fail(message: str) -> NoReturn:
    raise CliError(message)


# --- argument types ----------------------------------------------------------------------

# The plausible range of each numeric option (docs/decisions/0023): beyond it a value is a
# typo, and some would overflow later (`--limit 1e30` as an SQL integer, `--interval` in
# `time.sleep`, `--days` in a date).
#: Times (`--since`, `--until`, `--now`): the window every event time lies in, 2000 to
#: 2100 UTC (`airflow_ett.ett.events.TS_MIN`/`TS_MAX`, repeated here so that parsing the
#: arguments does not import the event code: 30 ms on every command; a test holds them
#: equal).
TS_MIN = 946_684_800.0
TS_MAX = 4_102_444_800.0
#: Rows a listing prints (`runs list --limit`).
MAX_LIMIT = 100_000
#: Days looked back (`tenants check --days`): ten years.
MAX_DAYS = 3660
#: Seconds between the preemption controller's looks: an hour at most (a slower look
#: is no controller).
MAX_INTERVAL_S = 3600
#: Seconds a command waits for a run (`embedded run --timeout`): a day.
MAX_WAIT_S = 86_400.0
#: GPUs of a fleet (`simulate-preemption --capacity`): the tenants file's bound
#: (`airflow_ett.scheduling.limits.MAX_GPUS`, repeated for the same reason as the times).
MAX_GPUS = 1 << 20


def time_arg(text: str) -> float:
    """Unix seconds or an ISO-8601 date/time (UTC when no zone is given), from 2000 to
    2100 UTC."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise argparse.ArgumentTypeError(f"not a time: {text!r} (a finite number of "
                                             "Unix seconds, or ISO-8601)")
        return _in_window(text, seconds)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (use Unix seconds or ISO-8601, e.g. 2026-11-28T10:00Z)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return _in_window(text, parsed.timestamp())


def _in_window(text: str, seconds: float) -> float:
    if not TS_MIN <= seconds < TS_MAX:
        raise argparse.ArgumentTypeError(f"not a time from 2000 to 2100 UTC: {text!r} (Unix "
                                         f"seconds in [{TS_MIN:.0f}, {TS_MAX:.0f}))")
    return seconds


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """argparse type: a whole number in [lo, hi] (argparse names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also a number of more digits than int() reads
            value = lo - 1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be a whole number in [{lo}, {hi}], got "
                                             f"{text!r}")
        return value

    return parse


#: The largest count or number of seconds an option takes (`--limit`, `--days`,
#: `--interval`): 2**31 - 1, far beyond any use, and within what SQLite's integers, a
#: thread's wait and date arithmetic take.
MAX_COUNT: int = 2**31 - 1

#: A whole number >= 1 (`--limit -1` must not mean "all" on SQLite and a database error
#: on PostgreSQL), at most what a 32-bit column holds; prefer a range of the option's own.
positive_int = int_in(1, MAX_COUNT)


def name_arg(text: str) -> str:
    """argparse type: a name looked up in the store (a job, tenant, model or DAG id), held
    to the event format's rule for identifiers (no NUL, valid Unicode: a file name that is
    not UTF-8 comes in with lone surrogates), so that a name no event can carry is a usage
    error naming it, not a database driver's encoding traceback."""
    from airflow_ett.ett.events import EventError, check_string

    try:
        return check_string("name", text)
    except EventError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message}: {text!r}") from None


def positive_seconds(text: str) -> float:
    """argparse type: a number of seconds in (0, `MAX_WAIT_S`]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 and <= "
                                         f"{MAX_WAIT_S:.0f}, got {text!r}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {text!r}")
    return value


# --- output ------------------------------------------------------------------------------


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


def print_json(obj: Any, out: TextIO) -> None:
    json.dump(_json_safe(obj), out, indent=2, sort_keys=False, allow_nan=False)
    out.write("\n")


# --- the store ---------------------------------------------------------------------------


def with_store(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--store-url", help="SQLAlchemy URL (default: [ett] store_url)")
    return parser


def store_url(args: argparse.Namespace) -> str:
    if args.store_url:
        return str(args.store_url)
    from airflow_ett.settings import EttSettings

    return EttSettings.load().store_url


def user_errors(load: Callable[[], type[Exception]], *,
                with_detail: bool = False) -> Callable[[Command], Command]:
    """Decorate a command so that the error class `load()` returns is the user's one-line
    error (exit 1). `load` imports the module that defines it, so that module (the store
    and SQLAlchemy, the embedded harness) is imported only when such a command runs.

    `with_detail`: the error's lines after its first (the embedded harness's log tails)
    are shown under the error line. Otherwise a newline in a message (from a path or a
    name it quotes) is escaped like the rest: it cannot start a line of its own."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def run(args: argparse.Namespace) -> int:
            error = load()
            try:
                return command(args)
            except error as exc:
                if not with_detail:
                    raise CliError(str(exc)) from exc
                first, *rest = str(exc).split("\n")
                raise CliError(first, tuple(rest)) from exc

        return run

    return decorate


def _store_error() -> type[Exception]:
    from airflow_ett.store import StoreError

    return StoreError


store_command = user_errors(_store_error)
"""For the commands that reach the store: its `StoreError` is the user's one-line error."""
