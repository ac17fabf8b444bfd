"""One job's part of one rollup day: the seconds inside the day, and the events of the day.

Two kinds of figure, two rules (docs/decisions/0010-rollup-days.md):

- *Time* (E2E, the six components, GPU-hours) is cut from the job's attributed timeline at
  the day's bounds (`clip_to_window`), so a job across midnight puts each second in the
  day it happened, and the days of a partition add up to the job exactly.
- *Counts and durations of things that happen at an instant* land whole in the day of
  that instant: a failure (with its cause and TTR) in the day of its `at`; TTS in the day
  its first effective step began; an attempt in the day it started. Summed over the days,
  each one is counted once.

*Slow steps* (Level 3 inside effective training, `ett/attribution/slow_steps.py`) are a
figure of the whole job, not of an instant nor labelled on its timeline: a job's loss
`L` is allocated to the days in proportion to its effective training time in each, by the
cumulative floor `L * E(hi) // E - L * E(lo) // E`, where `E(t)` is the job's effective
time before `t` and `E` its whole effective time. The days of a partition of time then
add up to `L` exactly (the floors telescope), each day computed alone, and a day never
gets more slow-step time than it has effective time (decision 0035).

A job still running is cut at its `now` (the attribution's end) and marked provisional.
Integers throughout (microseconds, GPU-microseconds), so that sums are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_ett.ett.attribution import JobAttribution, clip_to_window
from airflow_ett.ett.phases import EFFECTIVE
from airflow_ett.ett.timeline import to_us
from airflow_ett.rollup.calendar import DayWindow


@dataclass(frozen=True, slots=True)
class FailureInDay:
    cause: str
    ttr_us: int | None  # None for a failure inside TTS


@dataclass(frozen=True, slots=True)
class JobDay:
    """What one job contributes to one day. `gpus` is the job's world size."""

    job: str
    tenant: str
    model: str
    dag_id: str | None
    run_id: str | None
    gpus: int
    provisional: bool
    synthetic: bool
    e2e_us: int
    components_us: dict[str, int]
    tts_us: int | None  # counted in this day: the first effective step began in it
    failures: tuple[FailureInDay, ...]
    attempts: int  # attempts that started in the day
    preempted_attempts: int  # of those, the ones a preemption ended
    # not ended and silent too long: counted only up to a bound after its last event
    # (`[ett] rollup_silent_after_s`; decision 0010)
    silent: bool = False
    # the job's slow-step loss allocated to the day (inside `components_us[EFFECTIVE]`);
    # None: not known (a job row stored before the figure, decision 0035)
    slow_steps_us: int | None = None

    @property
    def effective_us(self) -> int:
        return self.components_us[EFFECTIVE]

    @property
    def lost_us(self) -> int:
        return self.e2e_us - self.effective_us

    @property
    def gpu_us(self) -> int:
        return self.e2e_us * self.gpus

    @property
    def lost_gpu_us(self) -> int:
        return self.lost_us * self.gpus

    @property
    def slow_steps_gpu_us(self) -> int | None:
        return None if self.slow_steps_us is None else self.slow_steps_us * self.gpus


def _slow_steps_in(attribution: JobAttribution, lo_us: int, effective_in_day_us: int) -> int:
    """The job's slow-step loss allocated to the window starting at `lo_us` that holds
    `effective_in_day_us` of its effective time: the cumulative floors of decision 0035."""
    slow = attribution.slow_steps
    whole = attribution.effective_us
    if slow is None or whole <= 0 or effective_in_day_us <= 0:
        return 0
    lost = min(slow.lost_us, whole)
    if lost <= 0:
        return 0
    tl = attribution.timeline
    before = 0
    if len(tl) and tl.starts[0] < lo_us:  # the job began before the window
        components = attribution.phase_components
        before = sum(us for label, us in tl.totals(None, lo_us).items()
                     if components[label] == EFFECTIVE)
    return lost * (before + effective_in_day_us) // whole - lost * before // whole


def job_day(attribution: JobAttribution, window: DayWindow, *, gpus: int = 1,
            synthetic: bool = False, silent: bool = False) -> JobDay | None:
    """The job's part of the day, or None when the job has no time and no event in it."""
    if gpus < 1:
        raise ValueError(f"gpus: {gpus!r} is not a positive GPU count")
    clipped = clip_to_window(attribution, window.lo, window.hi)
    lo, hi = clipped.lo_us, clipped.hi_us

    def inside(ts: float) -> bool:
        return lo <= to_us(ts) < hi

    first_step_us = to_us(attribution.submitted_at) + attribution.tts_us

    failures = tuple(FailureInDay(f.cause, f.ttr_us) for f in attribution.failures
                     if inside(f.at))
    started = [a for a in attribution.attempts if inside(a.start)]
    tts_us = None
    if attribution.started and lo <= first_step_us < hi:
        tts_us = attribution.tts_us
    if clipped.e2e_in_window_us == 0 and not failures and not started and tts_us is None:
        return None
    return JobDay(
        job=attribution.job, tenant=attribution.tenant, model=attribution.model,
        dag_id=attribution.dag_id, run_id=attribution.run_id, gpus=gpus,
        provisional=attribution.provisional, synthetic=synthetic,
        e2e_us=clipped.e2e_in_window_us, components_us=dict(clipped.components_us),
        tts_us=tts_us, failures=failures, attempts=len(started),
        preempted_attempts=sum(1 for a in started
                               if a.status == "failed" and a.cause == "preemption"),
        silent=silent,
        slow_steps_us=_slow_steps_in(attribution, lo, clipped.components_us[EFFECTIVE]),
    )
