"""Slow steps, Level 3 inside effective training: the ideal step time is the steps-weighted
median of the steady spans (not an attempt's first), and the time lost is what each
effective span took over `steps x ideal`. Worked out by hand, then as properties over
simulated jobs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    Progress,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate

T0 = 1_780_000_000.0


class _Job:
    """Events of one job, one attempt at a time, spans of 10 steps (100 cursor units)."""

    def __init__(self) -> None:
        self.events: list[Event] = [JobSubmitted(id="s", job="j", ts=T0, tenant="t",
                                                 model="m")]
        self.t = T0
        self.step = 0

    def attempt(self, name: str, *, step: int = 0, at: float | None = None) -> None:
        self.t = self.t + 5 if at is None else at
        self.step = step
        self.events.append(AttemptStarted(id=f"a{name}", job="j", ts=self.t, attempt=name))
        self.attempt_name = name

    def span(self, seconds: float, steps: int = 10) -> None:
        start, self.t = self.t, self.t + seconds
        s0, self.step = self.step, self.step + steps
        self.events.append(Progress(id=f"p{len(self.events)}", job="j", ts=self.t,
                                    attempt=self.attempt_name, start_ts=start,
                                    step_start=s0, step_end=self.step, cursor_start=s0 * 10,
                                    cursor_end=self.step * 10))

    def end(self, status: str = "success", cause: str | None = None) -> None:
        self.t += 1
        self.events.append(AttemptEnded(id=f"e{self.attempt_name}", job="j", ts=self.t,
                                        attempt=self.attempt_name, status=status,  # type: ignore[arg-type]
                                        cause=cause))  # type: ignore[arg-type]


def test_a_slow_span_and_the_warm_up_are_lost_the_rest_is_ideal() -> None:
    job = _Job()
    job.attempt("1")
    job.span(20.0)  # the warm-up: 2 s a step
    for _ in range(4):
        job.span(10.0)  # steady: 1 s a step
    job.span(30.0)  # slow: 3 s a step
    job.end()
    job.events.append(JobEnded(id="end", job="j", ts=job.t + 1, status="success"))
    s = attribute_job(job.events).summary()
    slow = s.slow_steps
    assert slow is not None
    assert slow.ideal_step_s == pytest.approx(1.0)  # median of 1, 1, 1, 1, 3 (10 steps each)
    assert slow.lost_s == pytest.approx(10.0 + 20.0)
    assert (slow.spans, slow.slow_spans) == (6, 2)
    assert (slow.effective_steps, slow.steady_steps) == (60, 50)
    assert slow.lost_pct_of_effective == pytest.approx(100 * 30 / 90)
    assert s.effective_s == pytest.approx(90.0)  # ETT% keeps its definition


def test_a_checkpoints_blocking_time_is_wasted_training_not_a_slow_step() -> None:
    job = _Job()
    job.attempt("1")
    job.span(10.0)
    job.span(10.0)
    job.span(15.0)  # 5 s of it blocked in a checkpoint save
    job.events.append(CheckpointSaved(id="c", job="j", ts=job.t + 20, attempt="1",
                                      start_ts=job.t - 7, step=30, cursor=300,
                                      blocking_s=5.0, total_s=20.0))
    job.span(10.0)
    job.end()
    job.events.append(JobEnded(id="end", job="j", ts=job.t + 1, status="success"))
    s = attribute_job(job.events).summary()
    assert s.csbt_s == pytest.approx(5.0)
    assert s.slow_steps is not None
    assert s.slow_steps.ideal_step_s == pytest.approx(1.0)
    assert s.slow_steps.lost_s == pytest.approx(0.0)


def test_replayed_steps_are_not_measured_and_a_restart_warms_up_again() -> None:
    job = _Job()
    job.attempt("1")
    for _ in range(3):
        job.span(10.0)
    job.end("failed", "infra")
    job.attempt("2", step=10)  # restored at step 10: steps 10-30 are replay
    job.span(40.0)  # warm-up of attempt 2, and replay: not measured
    job.span(12.0)  # replay of steps 20-30: not measured
    job.span(10.0)  # new data again
    job.end()
    job.events.append(JobEnded(id="end", job="j", ts=job.t + 1, status="success"))
    slow = attribute_job(job.events).summary().slow_steps
    assert slow is not None
    assert slow.spans == 4 and slow.effective_steps == 40  # 3 spans, then 1 after replay
    assert slow.ideal_step_s == pytest.approx(1.0) and slow.lost_s == pytest.approx(0.0)


def test_a_job_without_an_effective_step_has_no_figure() -> None:
    job = _Job()
    job.attempt("1")
    job.end("failed", "application")
    assert attribute_job(job.events, now=job.t + 10).summary().slow_steps is None


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(20, 200), step_s=st.floats(0.05, 5.0),
       every=st.integers(1, 20), failure_at=st.one_of(st.none(), st.integers(5, 19)))
def test_a_job_of_steady_steps_loses_nothing_and_its_ideal_is_its_step_time(
        steps: int, step_s: float, every: int, failure_at: int | None) -> None:
    failures = () if failure_at is None else (
        InjectedFailure(at_step=failure_at, cause="infra"),)
    spec = JobSpec(steps=steps, step_s=step_s, progress_every=every, failures=failures)
    s = attribute_job(simulate(spec)).summary()
    slow = s.slow_steps
    assert slow is not None
    assert math.isclose(slow.ideal_step_s, step_s, rel_tol=1e-3, abs_tol=2e-6)
    # microsecond rounding of each span's ends, at most a few per span
    assert slow.lost_s <= 4e-6 * slow.spans
    assert 0.0 <= slow.lost_s <= s.effective_s


@settings(max_examples=40, deadline=None)
@given(steady=st.integers(3, 30), slow_at=st.integers(1, 30), factor=st.floats(1.0, 20.0),
       steps=st.integers(1, 50))
def test_one_slow_span_loses_exactly_its_excess(steady: int, slow_at: int, factor: float,
                                                steps: int) -> None:
    job = _Job()
    job.attempt("1")
    for i in range(steady + 1):
        job.span(round(steps * (factor if i == min(slow_at, steady) else 1.0), 6), steps)
    job.end()
    job.events.append(JobEnded(id="end", job="j", ts=job.t + 1, status="success"))
    slow = attribute_job(job.events).summary().slow_steps
    assert slow is not None
    assert slow.ideal_step_s == pytest.approx(1.0)  # the slow span is one of many
    assert slow.lost_s == pytest.approx(steps * (factor - 1.0), abs=2e-6)
