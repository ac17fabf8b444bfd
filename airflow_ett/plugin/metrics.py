"""ETT figures out through Airflow's own metrics, so existing dashboards can show them.

Per finished job: ETT%, E2E, effective time (also in GPU-time: times the job's GPUs, so
that a dashboard's fleet ETT% weighs GPU time as the rollup's does, decision 0010), each
Level-2 component's GPU time (the fleet's shares), TTS, each TTR, NoF by cause and CSBT,
tagged with the DAG, tenant and model; per process: the emitter's counters (events sent,
spooled, dropped, ...). Names, kinds and units are in docs/metrics.md; the Grafana
dashboard over them is docs/grafana/airflow-ett.json.

Why through Airflow's `Stats` and not a client of our own: the deployment has already
said where metrics go (`[metrics] statsd_on`, `statsd_datadog_enabled`, `otel_on`, their
hosts, prefix, allow and block lists, name handler); going through Airflow honours all of
it, and nothing here needs its own configuration or network code.

Which `Stats`: Airflow 3.3 has two copies of the metrics module, core's
(`airflow.observability.stats`, set up by the scheduler, API server, dag processor,
triggerer and executors) and the Task SDK's (`airflow.sdk.observability.stats`, set up by
the task runner on a worker). `airflow.stats.Stats` is a deprecated shim onto the SDK's,
which the scheduler never sets up: sending there from the scheduler would send nothing.
`airflow_stats()` takes whichever copy this process has set up, core's first.

Tags: Datadog, InfluxDB-style StatsD and OpenTelemetry carry them; plain StatsD drops them.
So where the backend is plain StatsD, each metric is also sent under a name that carries
its tags (`ett.job.ett_pct.<tenant>.<model>.<dag_id>`), the way Airflow's own legacy
names carry a DAG id. The plain name is still sent: on plain StatsD it is the fleet's
aggregate (every job's timings, every job's failures).

`job_metrics` and `emitter_counter_metrics` are pure (names and values, testable without
Airflow); the `emit_*` functions send them and never raise: metrics must not fail the
scheduler loop they ride on.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from airflow_ett.emit._log import RateLimitedLog
from airflow_ett.ett.phases import COMPONENTS

if TYPE_CHECKING:
    from airflow_ett.emit import Emitter, EmitterStats
    from airflow_ett.ett.summary import JobSummary

log = logging.getLogger("airflow_ett.metrics")
_rate_limited = RateLimitedLog(log)

MetricKind = Literal["gauge", "timing", "incr"]

JOB: Final = "ett.job"
EMITTER: Final = "ett.emitter"
TAG_KEYS: Final = ("dag_id", "tenant", "model")
#: A tag whose value is missing (a job without a DAG, a DAG without a model tag).
UNKNOWN: Final = "unknown"
#: The longest name Airflow's default name handler accepts (`stat_name_default_handler`).
MAX_NAME: Final = 250

# Airflow accepts [A-Za-z0-9_.-/] in a name. Tag values keep letters, digits, `_`, `.`
# and `-` (so the same value reaches every backend, and InfluxDB-style tags, which
# become part of the name, stay valid); in a name segment `.` would add a level, so it
# becomes `__`, as Airflow does for its legacy names.
_TAG_VALUE_BAD: Final = re.compile(r"[^A-Za-z0-9_.\-]")
_SEGMENT_BAD: Final = re.compile(r"[^A-Za-z0-9_\-]")


@dataclass(frozen=True, slots=True)
class Metric:
    """One value to send: a gauge, a timing in milliseconds, or a counter increment."""

    name: str
    kind: MetricKind
    value: float
    tags: Mapping[str, str]


def tag_value(value: str | None) -> str:
    """`value` as a tag: characters Airflow's name rules refuse become `_`."""
    return _TAG_VALUE_BAD.sub("_", value) if value else UNKNOWN


def job_tags(summary: JobSummary) -> dict[str, str]:
    return {"dag_id": tag_value(summary.dag_id), "tenant": tag_value(summary.tenant),
            "model": tag_value(summary.model)}


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def job_metrics(summary: JobSummary) -> list[Metric]:
    """The metrics of one finished job; none for a provisional one (still running, or its
    end not yet stored): its figures would still move, and a gauge would show them as if
    final.

    TTS is left out for a job that never reached an effective step: it has no time to
    start yet, only the whole E2E spent before one (which `ett.job.e2e` already says).
    """
    if summary.provisional:
        return []
    tags = job_tags(summary)

    def m(name: str, kind: MetricKind, value: float) -> Metric:
        return Metric(f"{JOB}.{name}", kind, value, tags)

    out = [
        m("finished", "incr", 1),
        m("ett_pct", "gauge", summary.ett_pct),
        m("e2e", "timing", _ms(summary.e2e_s)),
        m("effective", "timing", _ms(summary.effective_s)),
        # GPU-ms: sum(gpu_effective) / sum(gpu_e2e) is the fleet's ETT% by GPU time
        m("gpu_e2e", "timing", _ms(summary.e2e_s) * summary.world_size),
        m("gpu_effective", "timing", _ms(summary.effective_s) * summary.world_size),
    ]
    # GPU-ms of each Level-2 component, zeros included (every series exists): the fleet's
    # share of c is sum(gpu_component.c) / sum(gpu_e2e); the six add up to gpu_e2e.
    out.extend(m(f"gpu_component.{c}", "timing",
                 _ms(summary.components.get(c, 0.0)) * summary.world_size)
               for c in COMPONENTS)
    if summary.started:
        out.append(m("tts", "timing", _ms(summary.tts_s)))
    out.extend(m("ttr", "timing", _ms(ttr)) for ttr in summary.ttr_s)
    # Counters, zero included: a cause that did not happen is a 0, not a gap in a chart.
    out.extend(m(f"nof.{_SEGMENT_BAD.sub('_', cause)}", "incr", count)
               for cause, count in summary.nof.items())
    out.append(m("csbt", "timing", _ms(summary.csbt_s)))
    return out


def with_tags_in_names(metrics: list[Metric]) -> list[Metric]:
    """For a backend that drops tags (plain StatsD): each tagged metric once more, under
    `<name>.<tenant>.<model>.<dag_id>`. A name over Airflow's limit is left out (a long DAG
    id); its plain form still goes."""
    out: list[Metric] = []
    for metric in metrics:
        if not metric.tags:
            continue
        parts = [metric.tags.get(k, UNKNOWN) for k in ("tenant", "model", "dag_id")]
        segments = ".".join(_SEGMENT_BAD.sub("_", p.replace(".", "__")) for p in parts)
        name = f"{metric.name}.{segments}"
        if len(name) <= MAX_NAME:
            out.append(Metric(name, metric.kind, metric.value, {}))
        else:
            _rate_limited(logging.INFO, "name-too-long", "ETT metrics: %s is over %d "
                          "characters; sent without its tags in the name", name, MAX_NAME)
    return out


# -- the emitter's counters -------------------------------------------------------------

#: Metric name -> the `EmitterStats` fields it adds up.
EMITTER_COUNTERS: Final[Mapping[str, tuple[str, ...]]] = {
    "sent": ("written",),
    "spooled": ("spooled", "overflowed"),  # a batch the store refused, a queue that was full
    "dropped": ("dropped",),
    "rejected": ("rejected",),
    "replayed": ("replayed",),
    "write_failures": ("write_failures",),
    "write_timeouts": ("write_timeouts",),
}


def _counts(stats: EmitterStats) -> dict[str, int]:
    return {f.name: int(getattr(stats, f.name)) for f in fields(stats)}


def emitter_counter_metrics(current: EmitterStats,
                            previous: Mapping[str, int] | None = None) -> list[Metric]:
    """Counter increments for what the emitter did since `previous` (counts of an earlier
    `EmitterStats`); nothing for a counter that did not move. A count below its previous
    value means the writer started again (a fork): it counts from zero then."""
    now, before = _counts(current), dict(previous or {})
    out: list[Metric] = []
    for name, parts in EMITTER_COUNTERS.items():
        delta = 0
        for part in parts:
            prev = before.get(part, 0)
            delta += now[part] - prev if now[part] >= prev else now[part]
        if delta > 0:
            out.append(Metric(f"{EMITTER}.{name}", "incr", delta, {}))
    return out


class _CounterReports:
    """What this process last reported, so each report sends only what is new."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._last = {}

    def take(self, current: EmitterStats) -> list[Metric]:
        with self._lock:
            metrics = emitter_counter_metrics(current, self._last)
            self._last = _counts(current)
            return metrics


_reports = _CounterReports()


# -- sending through Airflow ------------------------------------------------------------

class StatsLike(Protocol):
    """The part of Airflow's `Stats` used here."""

    def gauge(self, stat: str, value: float, *args: Any, **kwargs: Any) -> Any: ...

    def timing(self, stat: str, dt: Any, *args: Any, **kwargs: Any) -> Any: ...

    def incr(self, stat: str, *args: Any, **kwargs: Any) -> Any: ...


_STATS_MODULES: Final = ("airflow.observability.stats", "airflow.sdk.observability.stats")
_CONF_MODULES: Final = ("airflow.configuration", "airflow.sdk.configuration")


def _set_up(module: Any) -> bool:
    """Whether this process initialised that copy of Airflow's metrics module (an
    uninitialised one sends nothing). True when the module no longer says."""
    impl = sys.modules.get(getattr(module.initialize, "__module__", ""))
    return getattr(impl, "_factory", True) is not None


def airflow_stats() -> StatsLike:
    """The `Stats` this process's Airflow set up (module docstring); core's when none is."""
    found: list[Any] = []
    for name in _STATS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if _set_up(module):
            return module.Stats  # type: ignore[no-any-return]
        found.append(module)
    if found:
        return found[0].Stats  # type: ignore[no-any-return]
    # Airflow before 3.2: `airflow.stats` was the one Stats there was.
    return importlib.import_module("airflow.stats").Stats  # type: ignore[no-any-return]


def _airflow_conf() -> Any:
    for name in _CONF_MODULES:
        try:
            return importlib.import_module(name).conf
        except (ImportError, AttributeError):
            continue
    return None


def backend_on(conf: Any = None) -> bool:
    """Whether `[metrics]` sends anywhere (Datadog, StatsD or OpenTelemetry): with none,
    what would be computed only to be dropped is not computed."""
    conf = conf if conf is not None else _airflow_conf()
    if conf is None:
        return False
    return any(bool(conf.getboolean("metrics", key, fallback=False))
               for key in ("statsd_datadog_enabled", "statsd_on", "otel_on"))


def backend_drops_tags(conf: Any = None) -> bool:
    """Whether the metrics backend Airflow picks from `[metrics]` drops tags: plain
    StatsD (no InfluxDB tagging), or Datadog told not to send them. Airflow's order:
    Datadog, then StatsD, then OpenTelemetry."""
    conf = conf if conf is not None else _airflow_conf()
    if conf is None:
        return False

    def on(key: str, default: bool) -> bool:
        return bool(conf.getboolean("metrics", key, fallback=default))

    if on("statsd_datadog_enabled", False):
        return not on("statsd_datadog_metrics_tags", True)
    if on("statsd_on", False):
        return not on("statsd_influxdb_enabled", False)
    return False


def send(metrics: list[Metric], stats: StatsLike) -> int:
    """Send each metric; returns how many went. One that fails is logged (rate-limited)
    and the others still go."""
    sent = 0
    for metric in metrics:
        tags = dict(metric.tags) or None
        try:
            if metric.kind == "gauge":
                stats.gauge(metric.name, metric.value, tags=tags)
            elif metric.kind == "timing":
                stats.timing(metric.name, metric.value, tags=tags)
            else:
                stats.incr(metric.name, int(metric.value), tags=tags)
            sent += 1
        except Exception as exc:
            _rate_limited(logging.WARNING, f"send-{type(exc).__name__}",
                          "ETT metrics: %s not sent: %r", metric.name, exc)
    return sent


def _guarded(what: str, fn: Callable[[], int]) -> int:
    try:
        return fn()
    except Exception as exc:
        _rate_limited(logging.WARNING, f"{what}-{type(exc).__name__}",
                      "ETT metrics: %s not sent: %r", what, exc)
        return 0


def emit_job_metrics(summary: JobSummary, *, stats: StatsLike | None = None,
                     tags_in_names: bool | None = None) -> int:
    """Send a finished job's metrics through Airflow; how many were sent (0 for a
    provisional job). `stats` and `tags_in_names` default to what Airflow is set up with."""

    def go() -> int:
        metrics = job_metrics(summary)
        if not metrics:
            return 0
        drops = backend_drops_tags() if tags_in_names is None else tags_in_names
        if drops:
            metrics = metrics + with_tags_in_names(metrics)
        return send(metrics, stats if stats is not None else airflow_stats())

    return _guarded("job metrics", go)


def emit_emitter_counters(current: EmitterStats, *, stats: StatsLike | None = None) -> int:
    """Send what this process's emitter did since the last report (counters)."""
    return _guarded("emitter counters", lambda: send(
        _reports.take(current), stats if stats is not None else airflow_stats()))


def report_finished_job(job: str, store: Any, emitter: Emitter, flush_timeout: float) -> int:
    """After a DAG run's end, on the listener's background thread: the job's metrics from
    the store, then the emitter's counters. Never raises.

    The emitter is flushed first (bounded), so that a `job_ended` this process just wrote
    is in the store when the summary is read. A job whose summary cannot be read, or is
    still provisional (its end is spooled, the store being down), gets nothing sent and
    one rate-limited log line: the store keeps its events, and `airflow-ett runs show`
    gives its figures later.
    """
    sent = 0
    try:
        emitter.flush(flush_timeout)
        summary = store.job_summary(job)
    except Exception as exc:
        _rate_limited(logging.WARNING, f"read-{type(exc).__name__}",
                      "ETT metrics: job %s: no metrics sent, its summary cannot be read: %r",
                      job, exc)
        summary = None
    if summary is not None:
        if summary.provisional:
            _rate_limited(logging.INFO, "provisional", "ETT metrics: job %s: no metrics "
                          "sent, its end is not in the store yet", job)
        else:
            sent += emit_job_metrics(summary)
    return sent + _guarded("emitter counters", lambda: emit_emitter_counters(emitter.stats()))
