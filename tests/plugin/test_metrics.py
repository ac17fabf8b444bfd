"""ETT metrics out through Airflow's `Stats` (airflow_ett/plugin/metrics.py).

The names and values are checked as pure data against a `JobSummary` of a simulated job;
Airflow's own name validators must accept every name; the listener's DAG-run end sends
them through a recording `Stats`; and two fresh interpreters, with `[metrics]` pointed at
a real UDP socket this test listens on, send real StatsD lines (plain, then with
InfluxDB-style tags), as the scheduler would once it has set up Airflow's metrics.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ett.emit import Emitter, EmitterStats
from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.summary import JobSummary
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.plugin import metrics
from airflow_ett.plugin.listeners import EttListener
from airflow_ett.plugin.metrics import (
    MAX_NAME,
    Metric,
    backend_drops_tags,
    emit_job_metrics,
    emitter_counter_metrics,
    job_metrics,
    report_finished_job,
    send,
    with_tags_in_names,
)
from airflow_ett.settings import EttSettings
from airflow_ett.store import EttStore, upgrade

BIN = Path(sys.executable).parent
TAGS = {"dag_id": "ett_dlrm_demo", "tenant": "ads-ranking", "model": "dlrm_small"}

SPEC = JobSpec(failures=(InjectedFailure(at_step=30, cause="infra"),
                         InjectedFailure(at_step=60, cause="preemption"),
                         InjectedFailure(at_step=80, cause="infra")), world_size=4)


def summary_of(spec: JobSpec = SPEC) -> JobSummary:
    return attribute_job(simulate(spec)).summary()


def by_name(found: list[Metric]) -> dict[str, list[Metric]]:
    out: dict[str, list[Metric]] = {}
    for metric in found:
        out.setdefault(metric.name, []).append(metric)
    return out


# -- names and values ------------------------------------------------------------------

def test_job_metrics_are_the_summary_s_figures_in_airflow_units() -> None:
    s = summary_of()
    assert not s.provisional and s.started and len(s.ttr_s) == 3  # the case is what it says
    got = by_name(job_metrics(s))
    assert all(m.tags == TAGS for ms in got.values() for m in ms)

    def one(name: str) -> Metric:
        (metric,) = got[f"ett.job.{name}"]
        return metric

    assert (one("ett_pct").kind, one("ett_pct").value) == ("gauge", s.ett_pct)
    assert 0 < s.ett_pct < 100
    for name, seconds in (("e2e", s.e2e_s), ("effective", s.effective_s), ("tts", s.tts_s),
                          ("csbt", s.csbt_s)):
        assert one(name).kind == "timing"
        assert one(name).value == pytest.approx(seconds * 1000.0), name  # ms, as Airflow's
    assert s.csbt_s > 0
    # GPU-ms, for a fleet ETT% weighed by GPU time: sum(gpu_effective) / sum(gpu_e2e)
    assert s.world_size > 1
    for name, seconds in (("gpu_e2e", s.e2e_s), ("gpu_effective", s.effective_s)):
        assert one(name).kind == "timing"
        assert one(name).value == pytest.approx(seconds * 1000.0 * s.world_size), name
    # GPU-ms per Level-2 component, all six (zeros too): a fleet's share is
    # sum(gpu_component.c) / sum(gpu_e2e), so the six add up to gpu_e2e
    parts = {c: one(f"gpu_component.{c}") for c in COMPONENTS}
    assert {p.kind for p in parts.values()} == {"timing"}
    for c, part in parts.items():
        assert part.value == pytest.approx(s.components[c] * 1000.0 * s.world_size), c
    assert sum(p.value for p in parts.values()) == pytest.approx(one("gpu_e2e").value)
    assert parts["effective_training"].value == pytest.approx(one("gpu_effective").value)
    assert sum(p.value > 0 for p in parts.values()) >= 4  # the case spreads its time
    ttrs = got["ett.job.ttr"]
    assert [m.kind for m in ttrs] == ["timing"] * 3
    assert [m.value for m in ttrs] == pytest.approx([t * 1000.0 for t in s.ttr_s])
    nof = {name.removeprefix("ett.job.nof."): [m.value for m in ms]
           for name, ms in got.items() if name.startswith("ett.job.nof.")}
    assert nof == {"infra": [2], "preemption": [1], "application": [0], "unknown": [0],
                   "total": [3]}
    assert {got[n][0].kind for n in got if n.startswith("ett.job.nof.")} == {"incr"}
    assert (one("finished").kind, one("finished").value) == ("incr", 1)
    assert set(got) == {f"ett.job.{n}" for n in (
        "finished", "ett_pct", "e2e", "effective", "gpu_e2e", "gpu_effective", "tts", "ttr",
        "csbt")} | {
        f"ett.job.nof.{c}" for c in nof} | {f"ett.job.gpu_component.{c}" for c in COMPONENTS}


def test_a_provisional_job_sends_nothing() -> None:
    running = summary_of(JobSpec(running_until_step=40))
    assert running.provisional
    assert job_metrics(running) == []
    assert emit_job_metrics(running, stats=Recorder()) == 0


def test_a_job_that_never_trained_has_no_tts_and_unknown_tags_are_named() -> None:
    s = summary_of(JobSpec(steps=1, failures=()))
    never = msgspec_replace(s, started=False, effective_s=0.0, ett_pct=0.0, model="",
                            dag_id=None, tenant="ads ranking:eu")
    got = by_name(job_metrics(never))
    assert "ett.job.tts" not in got
    assert got["ett.job.ett_pct"][0].value == 0.0
    assert got["ett.job.finished"][0].tags == {"dag_id": "unknown", "tenant": "ads_ranking_eu",
                                               "model": "unknown"}


def msgspec_replace(s: JobSummary, **changes: Any) -> JobSummary:
    return JobSummary.from_dict({**s.to_dict(), **changes})


def test_tags_go_into_the_name_for_a_backend_that_drops_them() -> None:
    tags = {"dag_id": "team.ranking_v2", "tenant": "ads", "model": "dlrm/small"}
    plain = [Metric("ett.job.ett_pct", "gauge", 50.0, tags),
             Metric("ett.emitter.sent", "incr", 3, {})]
    (named,) = with_tags_in_names(plain)  # an untagged metric has nothing to add
    assert named == Metric("ett.job.ett_pct.ads.dlrm_small.team__ranking_v2", "gauge", 50.0,
                           {})
    long = Metric("ett.job.e2e", "timing", 1.0, {**tags, "dag_id": "d" * MAX_NAME})
    assert with_tags_in_names([long]) == []  # over Airflow's limit: only the plain name goes


def test_airflow_s_name_validators_accept_every_name() -> None:
    from airflow._shared.observability.metrics.validators import (
        stat_name_default_handler,
        stat_name_otel_handler,
    )

    s = msgspec_replace(summary_of(), dag_id="a" * 150, tenant="t.x", model="m-1")
    names = [m.name for m in job_metrics(s) + with_tags_in_names(job_metrics(s))]
    names += [m.name for m in emitter_counter_metrics(EmitterStats(*range(1, 9)))]
    assert len(names) > 20
    for name in names:
        assert stat_name_default_handler(name) == name
    for m in job_metrics(s) + emitter_counter_metrics(EmitterStats(*range(1, 9))):
        assert stat_name_otel_handler("airflow", m.name) == f"airflow.{m.name}"


def test_backend_drops_tags_follows_airflow_s_choice_of_backend() -> None:
    def conf(**values: bool) -> Any:
        return SimpleNamespace(getboolean=lambda section, key, fallback=False: (
            values.get(key, fallback)))

    assert backend_drops_tags(conf(statsd_on=True))
    assert not backend_drops_tags(conf(statsd_on=True, statsd_influxdb_enabled=True))
    assert not backend_drops_tags(conf(statsd_datadog_enabled=True))
    assert backend_drops_tags(conf(statsd_datadog_enabled=True,
                                   statsd_datadog_metrics_tags=False))
    assert not backend_drops_tags(conf(otel_on=True))
    assert not backend_drops_tags(conf())


# -- the emitter's counters --------------------------------------------------------------

def test_emitter_counters_are_the_increments_since_the_last_report() -> None:
    first = EmitterStats(written=5, spooled=2, overflowed=1, dropped=1)
    kinds = {m.name: (m.kind, m.value) for m in emitter_counter_metrics(first)}
    assert kinds == {"ett.emitter.sent": ("incr", 5), "ett.emitter.spooled": ("incr", 3),
                   "ett.emitter.dropped": ("incr", 1)}
    second = EmitterStats(written=9, spooled=2, overflowed=1, dropped=1, replayed=3)
    prev = {"written": 5, "spooled": 2, "overflowed": 1, "dropped": 1}
    got = {m.name: m.value for m in emitter_counter_metrics(second, prev)}
    assert got == {"ett.emitter.sent": 4, "ett.emitter.replayed": 3}
    assert emitter_counter_metrics(second, {**prev, "written": 9, "replayed": 3}) == []
    # A writer that started again (a fork) counts from zero.
    got = {m.name: m.value for m in emitter_counter_metrics(EmitterStats(written=2), prev)}
    assert got == {"ett.emitter.sent": 2}


def test_each_report_of_the_counters_sends_only_what_is_new(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_reports", metrics._CounterReports())
    rec = Recorder()
    assert metrics.emit_emitter_counters(EmitterStats(written=4), stats=rec) == 1
    assert metrics.emit_emitter_counters(EmitterStats(written=4), stats=rec) == 0
    assert metrics.emit_emitter_counters(EmitterStats(written=7, dropped=2), stats=rec) == 2
    assert rec.calls == [("incr", "ett.emitter.sent", 4, None),
                         ("incr", "ett.emitter.sent", 3, None),
                         ("incr", "ett.emitter.dropped", 2, None)]


# -- sending -------------------------------------------------------------------------------

class Recorder:
    """Stands in for Airflow's `Stats`: records each call."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, str, float, dict[str, str] | None]] = []
        self.fail_on = fail_on

    def _record(self, kind: str, stat: str, value: float, tags: Any) -> None:
        if stat == self.fail_on:
            raise RuntimeError("backend down")
        self.calls.append((kind, stat, value, tags))

    def gauge(self, stat: str, value: float, *args: Any, tags: Any = None) -> None:
        self._record("gauge", stat, value, tags)

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None:
        self._record("timing", stat, dt, tags)

    def incr(self, stat: str, *args: Any, tags: Any = None) -> None:
        self._record("incr", stat, args[0], tags)


def test_send_calls_the_matching_stats_method_and_survives_a_failing_one(
        caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(fail_on="ett.job.e2e")
    found = job_metrics(summary_of())
    with caplog.at_level(logging.WARNING, "airflow_ett.metrics"):
        assert send(found, rec) == len(found) - 1
    assert "ett.job.e2e not sent" in caplog.text
    kinds = {name: kind for kind, name, _, _ in rec.calls}
    assert kinds["ett.job.ett_pct"] == "gauge" and kinds["ett.job.tts"] == "timing"
    assert kinds["ett.job.nof.infra"] == "incr"
    assert {json.dumps(tags) for _, _, _, tags in rec.calls} == {json.dumps(TAGS)}


def test_emit_job_metrics_never_raises_and_adds_named_copies_when_asked() -> None:
    s = summary_of()
    rec = Recorder()
    n = emit_job_metrics(s, stats=rec, tags_in_names=True)
    assert n == 2 * len(job_metrics(s))
    assert ("gauge", "ett.job.ett_pct.ads-ranking.dlrm_small.ett_dlrm_demo", s.ett_pct,
            None) in rec.calls

    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("no stats here")

    assert emit_job_metrics(s, stats=Broken(), tags_in_names=False) == 0


def test_airflow_stats_takes_the_copy_this_process_set_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(name: str, factory: object) -> types.ModuleType:
        impl = types.ModuleType(f"{name}_impl")
        impl._factory = factory  # type: ignore[attr-defined]

        def initialize() -> None: ...

        initialize.__module__ = impl.__name__
        public = types.ModuleType(name)
        public.initialize = initialize  # type: ignore[attr-defined]
        public.Stats = f"Stats of {name}"  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, impl.__name__, impl)
        monkeypatch.setitem(sys.modules, name, public)
        return public

    fake("fake_core_stats", None)  # the scheduler's copy, not set up in a task process
    fake("fake_sdk_stats", object)  # the task runner set this one up
    monkeypatch.setattr(metrics, "_STATS_MODULES", ("fake_core_stats", "fake_sdk_stats"))
    assert str(metrics.airflow_stats()) == "Stats of fake_sdk_stats"
    sys.modules["fake_sdk_stats_impl"]._factory = None  # type: ignore[attr-defined]
    # Neither set up: core's, as Airflow's own code in this process would use.
    assert str(metrics.airflow_stats()) == "Stats of fake_core_stats"


# -- the listener's DAG-run end --------------------------------------------------------------

QUEUED = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ett.db"
    upgrade(url)
    return url


@pytest.fixture
def emitter(url: str, tmp_path: Path) -> Iterator[Emitter]:
    emitter = Emitter(sink=url, spool_dir=tmp_path / "spool", emit_timeout=5.0, linger=0.01)
    yield emitter
    emitter.close()


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(metrics, "airflow_stats", lambda: rec)
    monkeypatch.setattr(metrics, "backend_drops_tags", lambda conf=None: False)
    monkeypatch.setattr(metrics, "_reports", metrics._CounterReports())
    return rec


def test_a_dag_run_s_end_sends_its_job_s_metrics_and_the_emitter_s_counters(
        url: str, tmp_path: Path, emitter: Emitter, recorder: Recorder) -> None:
    settings = EttSettings(store_url=url, disabled=False, spool_dir=tmp_path / "spool",
                           emit_timeout=5.0, work_dir=tmp_path / "work")
    listener = EttListener(emitter=lambda: emitter, settings=lambda: settings)
    run = SimpleNamespace(dag_id="ranking", run_id="manual__1", queued_at=QUEUED,
                          start_date=QUEUED, end_date=QUEUED + timedelta(minutes=5), conf={},
                          run_type="manual",
                          dag=SimpleNamespace(tags={"ett", "ett:tenant=ads",
                                                    "ett:model=dlrm_small"}))
    listener.on_dag_run_running(run, "running")
    listener.flush(10.0)
    # The end the listener writes as a fallback is in the store before the summary is read:
    # the job is finished, not provisional, so its metrics go.
    listener.on_dag_run_failed(run, "failed")
    assert listener.flush(10.0)
    sent = {(kind, name): (value, tags) for kind, name, value, tags in recorder.calls}
    tags = {"dag_id": "ranking", "tenant": "ads", "model": "dlrm_small"}
    assert sent[("gauge", "ett.job.ett_pct")] == (0.0, tags)
    assert sent[("timing", "ett.job.e2e")] == (300_000.0, tags)  # queued -> end_date: 5 min
    assert sent[("incr", "ett.job.finished")] == (1, tags)
    assert sent[("incr", "ett.emitter.sent")][0] >= 2  # job_submitted, job_ended
    before = len(recorder.calls)
    listener.before_stopping(component=None)  # nothing new written: no counter moves
    assert len(recorder.calls) == before

    # A DAG the store never heard of (not an ETT job) sends nothing.
    listener.on_dag_run_success(SimpleNamespace(**{**vars(run), "run_id": "manual__9"}),
                                "success")
    assert listener.flush(10.0)
    assert len(recorder.calls) == before


def test_a_summary_that_cannot_be_read_sends_no_job_metrics_and_logs_once(
        url: str, emitter: Emitter, recorder: Recorder,
        caplog: pytest.LogCaptureFixture) -> None:
    class DownStore:
        def job_summary(self, job: str) -> JobSummary:
            raise ConnectionError("store down")

    metrics._rate_limited.reset()
    with caplog.at_level(logging.INFO, "airflow_ett.metrics"):
        for _ in range(3):
            assert report_finished_job("j", DownStore(), emitter, 1.0) == 0
    assert caplog.text.count("its summary cannot be read") == 1
    assert recorder.calls == []


def test_a_job_whose_end_is_not_stored_yet_sends_no_job_metrics(
        url: str, emitter: Emitter, recorder: Recorder) -> None:
    for event in simulate(JobSpec(job="run-1", running_until_step=40)):
        emitter.emit(event)
    with EttStore(url) as store:
        assert report_finished_job("run-1", store, emitter, 5.0) >= 1  # counters only
        assert store.job_summary("run-1").provisional
    assert {name for _, name, _, _ in recorder.calls} == {"ett.emitter.sent"}


# -- real StatsD lines on a real UDP socket ------------------------------------------------

CHILD = textwrap.dedent("""
    # What the scheduler does before its loop: set up Airflow's metrics from [metrics].
    from airflow.configuration import conf
    from airflow.observability import stats
    from airflow.observability.metrics import stats_utils

    stats.initialize(factory=stats_utils.get_stats_factory(),
                     export_legacy_names=conf.getboolean("metrics", "legacy_names_on"))

    from airflow_ett.emit import EmitterStats
    from airflow_ett.ett.attribution import attribute_job
    from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
    from airflow_ett.plugin.metrics import emit_emitter_counters, emit_job_metrics

    spec = JobSpec(failures=(InjectedFailure(at_step=30, cause="infra"),))
    summary = attribute_job(simulate(spec)).summary()
    n = emit_job_metrics(summary)
    n += emit_emitter_counters(EmitterStats(written=7, spooled=2, dropped=1))
    print("SENT", n)
""")


def statsd_lines(tmp_path: Path, **metrics_conf: str) -> tuple[int, list[tuple[str, str, str]]]:
    """Run CHILD with `[metrics]` pointed at a UDP socket bound here; (sent, lines), each
    line as (name, value, type)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        home = tmp_path / "airflow_home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__METRICS__", "AIRFLOW__ETT__"))}
        env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                   AIRFLOW__METRICS__STATSD_ON="True",
                   AIRFLOW__METRICS__STATSD_HOST="127.0.0.1",
                   AIRFLOW__METRICS__STATSD_PORT=str(sock.getsockname()[1]),
                   AIRFLOW__METRICS__STATSD_PREFIX="af")
        env.update({f"AIRFLOW__METRICS__{k.upper()}": v for k, v in metrics_conf.items()})
        proc = subprocess.run([str(BIN / "python"), "-c", CHILD], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        sent = int(proc.stdout.split("SENT")[-1])
        lines: list[tuple[str, str, str]] = []
        sock.settimeout(2.0)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65535).decode()
            except TimeoutError:
                break
            for line in data.splitlines():
                name, rest = line.split(":", 1)
                value, kind = rest.split("|")[:2]
                lines.append((name, value, kind))
        return sent, lines
    finally:
        sock.close()


@pytest.mark.integration
def test_plain_statsd_receives_the_lines_with_tags_in_the_names(tmp_path: Path) -> None:
    sent, lines = statsd_lines(tmp_path)
    ours = [line for line in lines if line[0].startswith("af.ett.")]
    assert len(ours) == sent  # every metric sent arrived, and nothing else of ours
    got = {(name, kind): value for name, value, kind in ours}
    s = attribute_job(simulate(JobSpec(failures=(InjectedFailure(at_step=30, cause="infra"),)))
                      ).summary()
    for suffix in ("", ".ads-ranking.dlrm_small.ett_dlrm_demo"):
        assert float(got[(f"af.ett.job.ett_pct{suffix}", "g")]) == pytest.approx(s.ett_pct)
        assert float(got[(f"af.ett.job.tts{suffix}", "ms")]) == pytest.approx(s.tts_s * 1000)
        assert float(got[(f"af.ett.job.ttr{suffix}", "ms")]) == pytest.approx(
            s.ttr_s[0] * 1000)
        assert float(got[(f"af.ett.job.csbt{suffix}", "ms")]) == pytest.approx(
            s.csbt_s * 1000)
        for c in COMPONENTS:  # world_size 1: GPU-ms are ms
            assert float(got[(f"af.ett.job.gpu_component.{c}{suffix}", "ms")]) == \
                pytest.approx(s.components[c] * 1000), c
        assert got[(f"af.ett.job.nof.infra{suffix}", "c")] == "1"
        assert got[(f"af.ett.job.nof.preemption{suffix}", "c")] == "0"
        assert got[(f"af.ett.job.finished{suffix}", "c")] == "1"
    assert got[("af.ett.emitter.sent", "c")] == "7"
    assert got[("af.ett.emitter.spooled", "c")] == "2"
    assert got[("af.ett.emitter.dropped", "c")] == "1"


@pytest.mark.integration
def test_influxdb_style_statsd_receives_the_tags_on_the_plain_names(tmp_path: Path) -> None:
    sent, lines = statsd_lines(tmp_path, statsd_influxdb_enabled="True")
    ours = {name: (value, kind) for name, value, kind in lines if name.startswith("af.ett.")}
    assert len(ours) == sent
    tags = ",dag_id=ett_dlrm_demo,tenant=ads-ranking,model=dlrm_small"
    assert ours[f"af.ett.job.ett_pct{tags}"][1] == "g"
    assert ours[f"af.ett.job.nof.infra{tags}"] == ("1", "c")
    assert not any(".ads-ranking." in name for name in ours)  # no copies with names
    assert ours["af.ett.emitter.sent"] == ("7", "c")


def test_opentelemetry_gets_the_tags_as_attributes() -> None:
    """Airflow's OpenTelemetry logger over an in-memory reader (no collector needed)."""
    from airflow._shared.observability.metrics.otel_logger import SafeOtelLogger
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    otel = SafeOtelLogger(MeterProvider(metric_readers=[reader]), prefix="airflow")
    s = summary_of()
    found = job_metrics(s)
    assert send(found, otel) == len(found)
    data = reader.get_metrics_data()
    assert data is not None
    points = {m.name: (type(m.data).__name__, p)
              for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics for p in m.data.data_points}
    assert {dict(p.attributes or {}) == TAGS for _, p in points.values()} == {True}
    kind, ett = points["airflow.ett.job.ett_pct"]
    assert (kind, ett.value) == ("Gauge", s.ett_pct)  # type: ignore[union-attr]
    kind, ttr = points["airflow.ett.job.ttr"]
    assert kind == "Histogram" and ttr.count == 3  # type: ignore[union-attr]
    assert ttr.sum == pytest.approx(sum(s.ttr_s) * 1000.0)  # type: ignore[union-attr]
    kind, infra = points["airflow.ett.job.nof.infra"]
    assert (kind, infra.value) == ("Sum", 2)  # type: ignore[union-attr]
