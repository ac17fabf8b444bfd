"""A running job's rolling-window gauges (airflow_ett/plugin/window_metrics.py).

The names and values are checked as pure data against the attribution of a simulated
running job; Airflow's own name validators must accept every name; the reporter reads a
real SQLite store and sends through a recording `Stats` (it stands in for Airflow's, as in
tests/plugin/test_metrics.py); the listener starts it for a train task's try on the worker
and stops it when the try ends, clearing the time gauges, and nothing it meets (a store
that cannot be read, a bad setting, a failing backend) reaches the task.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ett.emit import Emitter
from airflow_ett.ett.attribution import JobAttribution, attribute_job, last_windows
from airflow_ett.ett.events import Event
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.plugin import metrics
from airflow_ett.plugin.listeners import EttListener
from airflow_ett.plugin.metrics import MAX_NAME, Metric, with_tags_in_names
from airflow_ett.plugin.window_metrics import (
    WindowReporter,
    cleared,
    next_wait,
    window_metrics,
)
from airflow_ett.settings import EttSettings, RollingSettings, SettingsError
from airflow_ett.store import EttStore, upgrade

NOW = 1_780_000_000.0
JOB = "ranking__manual__1"
TAGS = {"dag_id": "ranking", "tenant": "ads", "model": "dlrm_small"}


def running_spec(submit_ts: float, until: int = 1200) -> JobSpec:
    """A 4-GPU job that failed once and still trains: 2,000 steps of 0.5 s, `until` done."""
    return JobSpec(job=JOB, tenant="ads", model="dlrm_small", dag_id="ranking",
                   run_id="manual__1", submit_ts=submit_ts, steps=2000, step_s=0.5,
                   world_size=4, running_until_step=until,
                   failures=(InjectedFailure(at_step=300, cause="infra", detection_s=20.0,
                                             reschedule_s=60.0),))


def age(until: int = 1200) -> float:
    """How long after its submission the job's last event is, plus a second."""
    return max(e.ts for e in simulate(running_spec(0.0, until))) + 1.0


AGE = age()  # about 13 minutes: longer than 5, shorter than 15 and 60


def stored_running(submit_ts: float) -> list[Event]:
    return simulate(running_spec(submit_ts))


def running(now: float = NOW) -> JobAttribution:
    """The job attributed a second after its last event."""
    a = attribute_job(stored_running(now - AGE), now=now)
    assert a.provisional and a.e2e_us == round(AGE * 1e6)
    return a


def by_name(found: list[Metric]) -> dict[str, float]:
    assert len({m.name for m in found}) == len(found)
    return {m.name: m.value for m in found}


# -- names and values ------------------------------------------------------------------

def test_each_window_s_gauges_are_its_figures() -> None:
    a = running()
    found = window_metrics(a, (5, 15, 60))
    assert all(m.kind == "gauge" and m.tags == TAGS for m in found)
    got = by_name(found)
    assert len(got) == 3 * (4 + len(COMPONENTS))
    for m, w in zip((5, 15, 60), last_windows(a, [300.0, 900.0, 3600.0]), strict=True):
        base = f"ett.window.{m}m"
        assert got[f"{base}.ett_pct"] == w.ett_pct
        assert got[f"{base}.e2e_s"] == w.e2e_in_window_s == min(60.0 * m, AGE)
        assert got[f"{base}.gpu_e2e_s"] == 4 * w.e2e_in_window_s
        assert got[f"{base}.gpu_effective_s"] == 4 * w.components_s["effective_training"]
        shares = [got[f"{base}.{c}_pct"] for c in COMPONENTS]
        assert sum(shares) == pytest.approx(100.0)
        assert got[f"{base}.effective_training_pct"] == pytest.approx(w.ett_pct)
    # the hour holds the whole 13-minute job, failure and recovery included
    assert got["ett.window.60m.ett_pct"] == pytest.approx(a.ett_pct)
    assert got["ett.window.5m.ett_pct"] > got["ett.window.60m.ett_pct"]  # steady now


def test_a_finished_job_or_no_window_sends_nothing() -> None:
    finished = attribute_job(simulate(JobSpec()))
    assert not finished.provisional and window_metrics(finished, (5,)) == []
    assert window_metrics(running(), ()) == []


def test_a_job_younger_than_its_windows_is_all_in_each() -> None:
    young = attribute_job(simulate(running_spec(NOW - age(40), until=40)), now=NOW)
    assert 0 < young.e2e_us < 300_000_000 and young.effective_us > 0
    got = by_name(window_metrics(young, (5, 60)))
    for m in (5, 60):
        assert got[f"ett.window.{m}m.e2e_s"] == young.e2e_us / 1e6
        assert got[f"ett.window.{m}m.ett_pct"] == young.ett_pct
        assert got[f"ett.window.{m}m.scheduling_pct"] == pytest.approx(
            100.0 * young.components_us["scheduling"] / young.e2e_us)


def test_airflow_s_name_validators_accept_every_name() -> None:
    from airflow._shared.observability.metrics.validators import (
        stat_name_default_handler,
        stat_name_otel_handler,
    )

    spec = dataclasses.replace(running_spec(NOW - AGE), dag_id="a" * 150, tenant="t.x",
                               model="m-1")
    a = attribute_job(simulate(spec), now=NOW)
    plain = window_metrics(a, (1, 59, 10080))
    named = with_tags_in_names(plain)
    assert len(named) == len(plain) > 20  # a 150-character DAG id still fits
    for m in plain + named:
        assert stat_name_default_handler(m.name) == m.name
    for m in plain:
        assert stat_name_otel_handler("airflow", m.name) == f"airflow.{m.name}"
    assert max(len(m.name) for m in named) <= MAX_NAME


def test_clearing_zeroes_the_time_gauges_only_plain_and_named() -> None:
    plain = window_metrics(running(), (5, 60))
    zeros = cleared(plain + with_tags_in_names(plain))
    assert {m.value for m in zeros} == {0.0}
    assert sorted(m.name for m in zeros if m.tags) == sorted(
        f"ett.window.{w}m.{g}" for w in (5, 60) for g in ("e2e_s", "gpu_e2e_s",
                                                         "gpu_effective_s"))
    assert len(zeros) == 2 * 2 * 3
    assert "ett.window.5m.gpu_e2e_s.ads.dlrm_small.ranking" in {m.name for m in zeros}
    assert cleared([Metric("ett.job.e2e", "timing", 5.0, TAGS)]) == []


# -- the reporter --------------------------------------------------------------------------

class Recorder:
    """Stands in for Airflow's `Stats`: records each gauge, or fails as a backend would."""

    def __init__(self) -> None:
        self.gauges: list[tuple[str, float, Any]] = []
        self.broken = False

    def gauge(self, stat: str, value: float, *args: Any, tags: Any = None) -> None:
        if self.broken:
            raise OSError("statsd host unreachable")
        self.gauges.append((stat, value, tags))

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None:
        raise AssertionError("no timing is a rolling-window metric")

    def incr(self, stat: str, *args: Any, tags: Any = None) -> None:
        raise AssertionError("no counter is a rolling-window metric")

    def last(self) -> dict[str, float]:
        return {stat: value for stat, value, _ in self.gauges}


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(metrics, "airflow_stats", lambda: rec)
    monkeypatch.setattr(metrics, "backend_drops_tags", lambda conf=None: False)
    monkeypatch.setattr(metrics, "backend_on", lambda conf=None: True)
    return rec


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ett.db"
    upgrade(url)
    return url


@pytest.fixture
def store(url: str) -> Iterator[EttStore]:
    with EttStore(url) as s:
        yield s


def fast(minutes: tuple[int, ...] = (5, 60)) -> Callable[[], RollingSettings]:
    """Settings a test can wait for (a real [ett] value is at least 10 s)."""
    return lambda: RollingSettings(windows_min=minutes, metrics_interval_s=0.05)


def wait_for(what: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_tick_sends_the_stored_job_s_gauges_and_stop_clears_them(
        store: EttStore, recorder: Recorder) -> None:
    store.insert_events(stored_running(NOW - AGE))
    reporter = WindowReporter(JOB, lambda: store, clock=lambda: NOW)
    expected = window_metrics(running(), (5, 60))
    assert reporter.tick((5, 60)) == len(expected)
    assert recorder.gauges == [(m.name, m.value, TAGS) for m in expected]
    assert reporter.stop() == 6  # e2e_s, gpu_e2e_s, gpu_effective_s of two windows
    assert recorder.last()["ett.window.5m.gpu_e2e_s"] == 0.0
    assert recorder.last()["ett.window.5m.ett_pct"] == expected[0].value  # kept
    sent = len(recorder.gauges)
    assert reporter.tick((5, 60)) == 0 and reporter.stop() == 0  # stopped: nothing more
    assert len(recorder.gauges) == sent


def test_named_copies_go_too_where_the_backend_drops_tags(
        store: EttStore, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "backend_drops_tags", lambda conf=None: True)
    store.insert_events(stored_running(NOW - AGE))
    reporter = WindowReporter(JOB, lambda: store, clock=lambda: NOW)
    assert reporter.tick((5,)) == 2 * (4 + len(COMPONENTS))
    assert "ett.window.5m.ett_pct.ads.dlrm_small.ranking" in recorder.last()
    assert reporter.stop() == 2 * 3


def test_a_job_not_stored_yet_or_ended_sends_nothing_and_an_ended_one_stops(
        store: EttStore, recorder: Recorder) -> None:
    reporter = WindowReporter(JOB, lambda: store, clock=lambda: NOW)
    assert reporter.tick((5,)) == 0  # no event of it in the store yet: wait for the next
    store.insert_events(simulate(JobSpec(job=JOB, dag_id="ranking", run_id="manual__1",
                                         submit_ts=NOW - 1200.0)))  # it finished
    assert reporter.tick((5,)) == 0
    assert recorder.gauges == [] and reporter.join(0.1)
    assert reporter.tick((5,)) == 0  # stopped for good


def test_nothing_the_reporter_meets_reaches_its_caller(
        store: EttStore, recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    store.insert_events(stored_running(NOW - AGE))

    def down() -> EttStore:
        raise ConnectionError("store down")

    with caplog.at_level(logging.WARNING, "airflow_ett.metrics"):
        assert WindowReporter(JOB, down, clock=lambda: NOW).tick((5,)) == 0
        reporter = WindowReporter(JOB, lambda: store, clock=lambda: NOW)
        recorder.broken = True  # every gauge fails: each is logged, none raises
        assert reporter.tick((5,)) == 0
        recorder.broken = False
        assert reporter.tick((5,)) > 0
        recorder.broken = True
        assert reporter.stop() == 0
    assert "rolling-window gauges not sent: ConnectionError('store down')" in caplog.text
    assert "ett.window.5m.ett_pct not sent: OSError('statsd host unreachable')" in caplog.text


def test_a_bad_setting_costs_only_the_gauges_with_one_line(
        store: EttStore, recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    def bad() -> RollingSettings:
        raise SettingsError("[ett] rolling_windows names 5 minutes twice, in '5,5'")

    with caplog.at_level(logging.WARNING, "airflow_ett.metrics"):
        reporter = WindowReporter("a_job_of_its_own", lambda: store, bad)
        reporter.start()
        assert reporter.join(5.0)
    assert ("no rolling-window gauges for job a_job_of_its_own: [ett] rolling_windows names 5 "
            "minutes twice, in '5,5'") in caplog.text
    off = WindowReporter(JOB, lambda: store, lambda: RollingSettings((5,), 0.0))
    off.start()
    assert off.join(5.0) and recorder.gauges == []  # interval 0: no thread left running


def test_a_long_job_s_sends_are_spaced_to_take_at_most_2_percent_of_a_core() -> None:
    assert next_wait(60.0, 0.5) == 60.0  # a day-long job: the interval
    assert next_wait(60.0, 3.0) == pytest.approx(150.0)  # a week-long one: 3 s in 150 s
    assert next_wait(10.0, 0.0) == 10.0


def test_the_thread_sends_every_interval_until_stopped(store: EttStore,
                                                       recorder: Recorder) -> None:
    store.insert_events(stored_running(time.time() - AGE))
    reporter = WindowReporter(JOB, lambda: store, fast((5,)))
    reporter.start()
    per_tick = 4 + len(COMPONENTS)
    assert wait_for(lambda: len(recorder.gauges) >= 2 * per_tick)  # two ticks at least
    assert not reporter.join(0.0)
    reporter.stop()
    assert reporter.join(5.0)
    assert recorder.last()["ett.window.5m.e2e_s"] == 0.0


# -- the listener starts and stops it --------------------------------------------------------

class RuntimeTaskInstance(SimpleNamespace):
    """Named like the Task SDK's class: that is how the listener knows it is on a worker."""


def ti(state: str, role: str = "train") -> RuntimeTaskInstance:
    task = SimpleNamespace(dag=SimpleNamespace(tags={"ett", "ett:tenant=ads",
                                                     "ett:model=dlrm_small"}),
                           retry_delay=None, retry_exponential_backoff=False, ett_role=role)
    return RuntimeTaskInstance(dag_id="ranking", run_id="manual__1", task_id=role or "etl",
                               try_number=1, map_index=-1, state=state, task=task,
                               start_date=datetime.now(tz=UTC))


@pytest.fixture
def listener(url: str, tmp_path: Path) -> Iterator[EttListener]:
    emitter = Emitter(sink=url, spool_dir=tmp_path / "spool", emit_timeout=5.0, linger=0.01)
    settings = EttSettings(store_url=url, disabled=False, spool_dir=tmp_path / "spool",
                           emit_timeout=5.0, work_dir=tmp_path / "work")
    listener = EttListener(emitter=lambda: emitter, settings=lambda: settings,
                           rolling=fast())
    yield listener
    listener.stop_windows()
    emitter.close()


def test_a_train_try_on_the_worker_sends_while_it_runs(
        listener: EttListener, store: EttStore, recorder: Recorder) -> None:
    store.insert_events(stored_running(time.time() - AGE))
    listener.on_task_instance_running(None, ti("running"))
    assert wait_for(lambda: "ett.window.60m.gpu_e2e_s" in recorder.last())
    assert recorder.last()["ett.window.60m.gpu_e2e_s"] >= 4 * AGE  # the clock moves on
    listener.on_task_instance_success("running", ti("success"))
    assert recorder.last()["ett.window.60m.gpu_e2e_s"] == 0.0  # cleared in the hook
    sent = len(recorder.gauges)
    time.sleep(0.3)  # six intervals: nothing more comes
    assert len(recorder.gauges) == sent


def test_only_a_train_try_on_the_worker_starts_one_and_before_stopping_ends_it(
        listener: EttListener, store: EttStore, recorder: Recorder) -> None:
    store.insert_events(stored_running(time.time() - AGE))
    listener.on_task_instance_running(None, ti("running", role="prewarm"))
    scheduler_side = SimpleNamespace(**vars(ti("running")))  # not a RuntimeTaskInstance
    listener.on_task_instance_running(None, scheduler_side)
    time.sleep(0.3)
    assert recorder.gauges == []
    listener.on_task_instance_running(None, ti("running"))
    listener.on_task_instance_running(None, ti("running"))  # one reporter per job
    assert wait_for(lambda: len(recorder.gauges) > 0)
    listener.before_stopping(component=None)  # a reschedule ends a try without a hook
    assert recorder.last()["ett.window.5m.e2e_s"] == 0.0
    sent = len(recorder.gauges)
    time.sleep(0.3)
    assert len(recorder.gauges) == sent


def test_with_no_metrics_backend_the_thread_reads_nothing(store: EttStore,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """`[metrics]` sending nowhere: no store read, no attribution, every minute, for
    nothing (the real `backend_on`, on a configuration with every backend off)."""
    reads: list[str] = []

    class Spy:
        def job_events(self, job: str) -> list[object]:
            reads.append(job)
            return []

    for key in ("STATSD_ON", "OTEL_ON", "STATSD_DATADOG_ENABLED"):
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", "False")
    assert metrics.backend_on() is False
    reporter = WindowReporter(JOB, Spy, fast((5,)))
    reporter.start()
    assert reporter.join(5.0)  # it returned at once
    assert reads == []
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_ON", "True")
    assert metrics.backend_on() is True
