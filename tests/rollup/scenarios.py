"""Hand-made jobs for the rollup tests (store and pure), with their figures worked out on
paper in tests/rollup/test_day.py.

Day D is 2026-11-28 in UTC, `[LO, LO + 86400)` (the builders take another midnight `lo`
for tests that need days relative to today). Job A (tenant t1, 2 GPUs) runs across
midnight into D; job B (tenant t2, 1 GPU) runs inside D with one infra failure.
"""

from __future__ import annotations

import datetime as dt

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    Event,
    JobEnded,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.rollup import JobDay, day_window

D = dt.date(2026, 11, 28)
WINDOW = day_window(D, "UTC")
LO = WINDOW.lo
PREVIOUS = day_window(D - dt.timedelta(days=1), "UTC")


class Maker:
    def __init__(self, job: str) -> None:
        self.job, self.n = job, 0

    def __call__(self, cls: type, **fields: object) -> Event:
        self.n += 1
        return cls(id=f"{self.job}-{self.n}", job=self.job, **fields)  # type: ignore[no-any-return]


def job_a(lo: float = LO) -> list[Event]:
    """Submitted 1 h before midnight, queued 600 s, then 6000 s of effective steps."""
    m = Maker("a")
    return [
        m(JobSubmitted, ts=lo - 3600, tenant="t1", model="m1", world_size=2),
        m(AttemptStarted, ts=lo - 3000, attempt="1"),
        m(Progress, ts=lo + 3000, attempt="1", start_ts=lo - 3000, step_start=0, step_end=60,
          cursor_start=0, cursor_end=600),
        m(AttemptEnded, ts=lo + 3000, attempt="1", status="success"),
        m(JobEnded, ts=lo + 3000, status="success"),
    ]


def job_b(lo: float = LO) -> list[Event]:
    """Inside D: queue 100, compile 200, 1000 effective, infra failure detected 100 s after
    the last progress, 100 s rescheduling, 500 s replay, 500 s effective."""
    m = Maker("b")
    return [
        m(JobSubmitted, ts=lo + 7200, tenant="t2", model="m1"),
        m(AttemptStarted, ts=lo + 7300, attempt="1"),
        m(PhaseStarted, ts=lo + 7300, attempt="1", phase="compile"),
        m(PhaseEnded, ts=lo + 7500, attempt="1", phase="compile"),
        m(Progress, ts=lo + 8500, attempt="1", start_ts=lo + 7500, step_start=0, step_end=10,
          cursor_start=0, cursor_end=50),
        m(AttemptEnded, ts=lo + 8600, attempt="1", status="failed", cause="infra"),
        m(AttemptStarted, ts=lo + 8700, attempt="2"),
        m(Progress, ts=lo + 9200, attempt="2", start_ts=lo + 8700, step_start=0, step_end=5,
          cursor_start=0, cursor_end=50),
        m(Progress, ts=lo + 9700, attempt="2", start_ts=lo + 9200, step_start=5, step_end=10,
          cursor_start=50, cursor_end=100),
        m(AttemptEnded, ts=lo + 9700, attempt="2", status="success"),
        m(JobEnded, ts=lo + 9700, status="success"),
    ]


def late_job(lo: float = LO) -> list[Event]:
    """Arrives after D was rolled up: 1000 s of one failed attempt that made no step."""
    m = Maker("late")
    return [m(JobSubmitted, ts=lo + 20_000, tenant="t3"),
            m(AttemptStarted, ts=lo + 20_000, attempt="1"),
            m(AttemptEnded, ts=lo + 21_000, attempt="1", status="failed", cause="application"),
            m(JobEnded, ts=lo + 21_000, status="failed")]


def issue_day_jobs(day: str = "2026-11-29") -> list[JobDay]:
    """Issue 22's day, built as job-days: job X (8 GPUs) and job Y (1 GPU).

    X: 27,000 s of E2E, 1,717 s scheduling + 3,000 s wasted lost, 22,283 s effective.
    Y: 16,308 s of E2E, 2,544 s initialization + 4,000 s compilation lost, 9,764 s effective.
    GPU time: 8 x 27,000 + 16,308 = 232,308 GPU-s = 64.53 GPU-h; lost: 8 x 4,717 + 6,544
    = 44,280 GPU-s = 12.30 GPU-h; by GPU time ETT% = 100 x 188,028 / 232,308 = 80.94.
    Weighed by seconds (the old, wrong way): 100 x 32,047 / 43,308 = 74.00.
    """
    s = 10**6

    def jd(job: str, tenant: str, gpus: int, components: dict[str, int]) -> JobDay:
        full = {c: components.get(c, 0) * s for c in COMPONENTS}
        return JobDay(job=job, tenant=tenant, model="dlrm", dag_id=f"dag_{job}",
                      run_id=f"{day}_{job}", gpus=gpus, provisional=False, synthetic=False,
                      e2e_us=sum(full.values()), components_us=full,
                      tts_us=sum(components.get(c, 0) for c in COMPONENTS[:3]) * s,
                      failures=(), attempts=1,
                      preempted_attempts=0)

    return [jd("x", "big", 8, {"scheduling": 1717, "wasted_training": 3000,
                               "effective_training": 22283}),
            jd("y", "small", 1, {"initialization": 2544, "compilation": 4000,
                                 "effective_training": 9764})]


class SlowJob:
    """One job's events: spans of 10 steps (100 cursor units each), attempt by attempt."""

    def __init__(self, job: str, at: float, *, tenant: str = "t", model: str = "m",
                 gpus: int = 1) -> None:
        self.job, self.t, self.step, self.n = job, at, 0, 0
        self.events: list[Event] = []
        self._add(JobSubmitted, ts=at, tenant=tenant, model=model, world_size=gpus)

    def _add(self, cls: type, **fields: object) -> None:
        self.n += 1
        self.events.append(cls(id=f"{self.job}-{self.n}", job=self.job, **fields))

    def attempt(self, name: str, *, wait: float = 5.0, step: int | None = None) -> None:
        self.t += wait
        self.attempt_name = name
        if step is not None:
            self.step = step
        self._add(AttemptStarted, ts=self.t, attempt=name)

    def span(self, seconds: float) -> None:
        start, self.t = self.t, self.t + seconds
        s0, self.step = self.step, self.step + 10
        self._add(Progress, ts=self.t, attempt=self.attempt_name, start_ts=start,
                  step_start=s0, step_end=self.step, cursor_start=s0 * 10,
                  cursor_end=self.step * 10)

    def end_attempt(self, status: str = "success", cause: str | None = None) -> None:
        self.t += 1
        self._add(AttemptEnded, ts=self.t, attempt=self.attempt_name, status=status,
                  cause=cause)

    def end(self) -> list[Event]:
        self._add(JobEnded, ts=self.t, status="success")
        return self.events


def slow_job(lo: float = LO) -> list[Event]:
    """Slow steps across midnight (tenant t1, model m2, 4 GPUs): 2000 s of effective steps
    before midnight, 4000 s after, of which one span of 2000 s where the job's ideal (100 s
    a step, the median of its steady spans) would have taken 1000 s: 1000 s lost, 1/3 of
    it to the day before and 2/3 to D by effective time (decision 0035)."""
    job = SlowJob("s", lo - 2000, tenant="t1", model="m2", gpus=4)
    job.attempt("1", wait=0.0)
    for seconds in (1000.0, 1000.0, 1000.0, 2000.0, 1000.0):  # the first is the warm-up
        job.span(seconds)
    job.end_attempt()
    return job.end()
