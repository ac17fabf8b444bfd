"""The `[ett]` configuration, read without importing Airflow.

The trainer and the emitter run in processes that must not import Airflow (the trainer
runs alone under torchrun), so this reads the same sources Airflow would, in Airflow's
order: an explicit value, then the environment variable `AIRFLOW__ETT__<KEY>`, then the
`[ett]` section of `$AIRFLOW_HOME/airflow.cfg` (or `$AIRFLOW_CONFIG`), then the default.
The defaults are declared once, in `provider.py`, which Airflow also reads.
"""

from __future__ import annotations

import configparser
import os
import time
from dataclasses import dataclass
from pathlib import Path

from airflow_ett.provider import CONFIG_DEFAULTS


class SettingsError(ValueError):
    """A configuration value that cannot be used; the message names key and value."""


def _expand_path(value: str) -> Path:
    """`~` and `$VARS`, as Airflow expands AIRFLOW_HOME and AIRFLOW_CONFIG."""
    return Path(os.path.expandvars(value)).expanduser()


def airflow_home() -> Path:
    return _expand_path(os.environ.get("AIRFLOW_HOME", "~/airflow"))


def _expand(value: str) -> str:
    """`{AIRFLOW_HOME}` in a default expands to the live home, as Airflow's own defaults do."""
    return value.replace("{AIRFLOW_HOME}", str(airflow_home()))


#: A config file changed less than this long ago is parsed again at every read: a second
#: change within its timestamp's granularity (a few ms) could leave its size and times
#: as they were.
SETTLED_S = 2.0
_parsed: tuple[tuple[str, int, int, int, int], configparser.ConfigParser] | None = None


def _config_parser(path: Path) -> configparser.ConfigParser:
    """`path` parsed; the last parse again while the file is the same one, unchanged and
    settled (same inode, size and times). Airflow's generated airflow.cfg is ~4,000 lines,
    and each key of a section read means one parse otherwise (29 ms for the rollup's
    settings, which the run API reads per request: bench/RESULTS.md, issue 26)."""
    global _parsed
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _parsed
    settled = time.time() - max(st.st_mtime, st.st_ctime) > SETTLED_S
    if settled and cached is not None and cached[0] == key:
        return cached[1]
    # Airflow reads airflow.cfg with ConfigParser's default interpolation ('%%' is a
    # literal '%'), so a URL-encoded password written for Airflow must read the same here.
    parser = configparser.ConfigParser()
    parser.read(path, encoding="utf-8")
    _parsed = (key, parser) if settled else None
    return parser


def _from_config_file(key: str) -> str | None:
    path = _expand_path(os.environ.get("AIRFLOW_CONFIG", str(airflow_home() / "airflow.cfg")))
    if not path.is_file():
        return None
    try:
        parser = _config_parser(path)
        if parser.has_option("ett", key):
            return parser.get("ett", key)
    except OSError:  # gone or unreadable since: as ConfigParser.read takes it, no file
        return None
    except configparser.Error as exc:
        one_line = " ".join(str(exc).split())
        raise SettingsError(f"cannot read [ett] {key} from {path}: {one_line}") from None
    return None


def raw_setting(key: str) -> str:
    if key not in CONFIG_DEFAULTS:
        raise SettingsError(f"unknown [ett] key {key!r}; known: {sorted(CONFIG_DEFAULTS)}")
    env = os.environ.get(f"AIRFLOW__ETT__{key.upper()}")
    if env is not None:
        return env
    from_file = _from_config_file(key)
    if from_file is not None:
        return from_file
    return _expand(CONFIG_DEFAULTS[key])


def _parse_bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"[ett] {key} must be true or false, got {value!r}")


#: The plausible range of each number of the section (docs/decisions/0023): a value
#: outside is a typo or a unit mistake, refused with the key and the value.
#: `emit_timeout`: recording may hold a task up this long at most; past a few minutes the
#: task would be waiting on its own bookkeeping (and a thread's wait refuses 1e308 s).
MAX_EMIT_TIMEOUT_S = 300.0
#: `rollup_recompute_days`: each nightly run recomputes this many days: a year at most.
MAX_RECOMPUTE_DAYS = 366
#: `rollup_catchup_days`: missed days caught up after a pause: ten years at most (the
#: DAG's start date is that many days back; past year 1 it cannot be a date at all).
MAX_CATCHUP_DAYS = 3660


def _parse_positive_float(key: str, value: str, maximum: float) -> float:
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"[ett] {key} must be a number of seconds, got {value!r}") from None
    if not 0 < number <= maximum:
        raise SettingsError(f"[ett] {key} must be > 0 and <= {maximum:g}, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class EttSettings:
    store_url: str
    disabled: bool
    spool_dir: Path
    emit_timeout: float
    work_dir: Path

    @classmethod
    def load(cls) -> EttSettings:
        return cls(
            store_url=raw_setting("store_url"),
            disabled=_parse_bool("disabled", raw_setting("disabled")),
            spool_dir=Path(raw_setting("spool_dir")).expanduser(),
            emit_timeout=_parse_positive_float("emit_timeout", raw_setting("emit_timeout"),
                                               MAX_EMIT_TIMEOUT_S),
            work_dir=Path(raw_setting("work_dir")).expanduser(),
        )


def _parse_int(key: str, value: str, *, minimum: int, maximum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise SettingsError(f"[ett] {key} must be an integer, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise SettingsError(f"[ett] {key} must be in [{minimum}, {maximum}], got {value!r}")
    return number


def _parse_float_in(key: str, value: str, lo: float, hi: float) -> float:
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"[ett] {key} must be a number, got {value!r}") from None
    if not lo <= number <= hi:
        raise SettingsError(f"[ett] {key} must be in [{lo:g}, {hi:g}], got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class RollupSettings:
    """The fleet rollup's settings, loaded apart from `EttSettings` so that a bad value here
    is reported by the rollup and the reports, never by a listener in a training run."""

    timezone: str
    components_file: Path | None
    recompute_days: int
    catchup_days: int
    report_dir: Path
    whatif_cut_pct: float
    whatif_start_s: float
    silent_after_s: float  # 0: no bound

    @classmethod
    def load(cls) -> RollupSettings:
        # The one import of a part by a top-level helper (tests/test_import_gates.py allows
        # exactly this one): the zone is checked the way the rollup will read it.
        from airflow_ett.rollup.calendar import CalendarError, check_tz  # noqa: TID251

        tz = raw_setting("rollup_timezone").strip()
        try:
            check_tz(tz)
        except CalendarError:
            raise SettingsError(f"[ett] rollup_timezone must be an IANA time zone name such "
                                f"as 'UTC' or 'Europe/Berlin', got {tz!r}") from None
        components = raw_setting("components_file").strip()
        return cls(
            timezone=tz,
            components_file=_expand_path(components) if components else None,
            recompute_days=_parse_int("rollup_recompute_days",
                                      raw_setting("rollup_recompute_days"), minimum=1,
                                      maximum=MAX_RECOMPUTE_DAYS),
            catchup_days=_parse_int("rollup_catchup_days", raw_setting("rollup_catchup_days"),
                                    minimum=1, maximum=MAX_CATCHUP_DAYS),
            report_dir=_expand_path(raw_setting("report_dir")),
            whatif_cut_pct=_parse_float_in("whatif_cut_pct", raw_setting("whatif_cut_pct"),
                                           0, 100),
            whatif_start_s=_parse_float_in("whatif_start_s", raw_setting("whatif_start_s"),
                                           0, 86400),
            silent_after_s=_parse_float_in("rollup_silent_after_s",
                                           raw_setting("rollup_silent_after_s"), 0,
                                           366 * 86400),
        )


#: `rolling_windows`: how many windows at most (each is a column of the run page and a set
#: of gauges per running job), and the longest, a week, in minutes.
MAX_ROLLING_WINDOWS = 8
MAX_ROLLING_WINDOW_MIN = 7 * 24 * 60
#: `rolling_metrics_interval_s`: each send reads and attributes the job's events, so not
#: more often than every 10 s (a StatsD flush); an hour at most (the longest window).
MIN_ROLLING_INTERVAL_S = 10.0
MAX_ROLLING_INTERVAL_S = 3600.0


def parse_minutes(key: str, value: str) -> tuple[int, ...]:
    """`"5, 15,60"` -> (5, 15, 60): whole minutes, ascending, each once; `""` -> ()."""
    example = "whole minutes separated by commas, such as '5,15,60'"
    items = [item.strip() for item in value.split(",")] if value.strip() else []
    minutes: list[int] = []
    for item in items:
        if not item.isascii() or not item.isdigit():
            raise SettingsError(f"[ett] {key} must be {example}; {item!r} is not, in "
                                f"{value!r}")
        number = int(item) if len(item) <= 6 else MAX_ROLLING_WINDOW_MIN + 1  # int() of
        # thousands of digits is refused by Python itself, with a line that names no key
        if not 1 <= number <= MAX_ROLLING_WINDOW_MIN:
            raise SettingsError(f"[ett] {key}: each window must be 1 to "
                                f"{MAX_ROLLING_WINDOW_MIN} minutes, got {item!r} in "
                                f"{value!r}")
        if number in minutes:
            raise SettingsError(f"[ett] {key} names {number} minutes twice, in {value!r}")
        minutes.append(number)
    if len(minutes) > MAX_ROLLING_WINDOWS:
        raise SettingsError(f"[ett] {key} may name at most {MAX_ROLLING_WINDOWS} windows, "
                            f"got {len(minutes)} in {value!r}")
    return tuple(sorted(minutes))


def _parse_interval(key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"[ett] {key} must be a number of seconds, got {value!r}") from None
    if number != 0 and not MIN_ROLLING_INTERVAL_S <= number <= MAX_ROLLING_INTERVAL_S:
        raise SettingsError(f"[ett] {key} must be 0 (off) or in [{MIN_ROLLING_INTERVAL_S:g}, "
                            f"{MAX_ROLLING_INTERVAL_S:g}], got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class RollingSettings:
    """A running job's rolling windows, loaded apart from `EttSettings` so that a bad value
    here costs only the windows (the page says why; the task's gauges are not sent, one
    log line says why), never a task's recording."""

    windows_min: tuple[int, ...]  # ascending; () for none
    metrics_interval_s: float  # 0: no rolling-window gauges

    @property
    def sends_metrics(self) -> bool:
        return bool(self.windows_min) and self.metrics_interval_s > 0

    @classmethod
    def load(cls) -> RollingSettings:
        return cls(
            windows_min=parse_minutes("rolling_windows", raw_setting("rolling_windows")),
            metrics_interval_s=_parse_interval("rolling_metrics_interval_s",
                                               raw_setting("rolling_metrics_interval_s")),
        )

    @classmethod
    def load_windows(cls) -> tuple[int, ...]:
        """Only `rolling_windows` (what the pages use): one key read, not two."""
        return parse_minutes("rolling_windows", raw_setting("rolling_windows"))
