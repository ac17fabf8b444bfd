"""The figures of one group of job-days (the fleet, a tenant, a model) for one day.

Weighting: ETT% and the component shares are GPU-seconds over GPU-seconds, summed over
the group's jobs (`sum(effective_i * gpus_i) / sum(e2e_i * gpus_i)`): the share of the
group's GPU time that trained on new data, so a 64-GPU job weighs 64 times a 1-GPU job
of the same length, and a long job more than a short one (not a mean of per-job
percentages). They agree with the GPU-hours beside them: the share of a lost component
is its GPU-hours lost over the GPU-hours, and ETT% is 100 minus the lost shares
(decision 0010). A group with no GPU time (a day with no job) has no ETT% and no
shares: None, never 0. `e2e_s`, `effective_s` and `components_s` stay plain seconds
summed over jobs. Sums are taken in integer microseconds (GPU-microseconds) and turned
into seconds and hours only at the end, so the tenants' GPU-hours add up to the fleet's
exactly as the integers do.

Slow steps (Level 3, decision 0035) are time *inside* effective training, so they are in
neither `gpu_hours_lost` nor any lost share and leave ETT% as it is: the GPU-hours of
effective training spent on steps slower than each job's ideal, and their share of the
group's effective GPU time ("3.1% of effective training was lost to slow steps"). None
for a group holding a job-day whose slow steps are not known (stored before the figure),
and the share None for a group with no effective GPU time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from airflow_ett.ett.events import FAILURE_CAUSES
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup.job_day import JobDay

US_PER_S = 1_000_000
US_PER_H = 3600 * US_PER_S
#: The components of lost time: all but effective training.
LOST_COMPONENTS: Final = tuple(c for c in COMPONENTS if c != EFFECTIVE)


class GroupFigures(msgspec.Struct, frozen=True, kw_only=True):
    jobs: int
    provisional_jobs: int
    e2e_s: float  # seconds summed over the jobs (not GPU-weighted)
    effective_s: float
    ett_pct: float | None  # GPU-weighted; None: no GPU time (no job)
    components_s: dict[str, float]
    shares_pct: dict[str, float | None]  # of the GPU time, all six; None: no GPU time
    gpu_hours: float
    gpu_hours_lost: float
    gpu_hours_lost_by_component: dict[str, float]
    tts_p50_s: float | None
    tts_p90_s: float | None
    ttr_p50_s: float | None
    ttr_p90_s: float | None
    nof: dict[str, int]
    attempts: int
    attempts_per_job: float
    failures_per_attempt: float
    failures_per_attempt_without_preemption: float
    # Level 3 inside effective training (decision 0035); added after the first rows, hence
    # the defaults: None in a day stored before it
    gpu_hours_lost_to_slow_steps: float | None = None
    slow_steps_pct_of_effective: float | None = None  # of the effective GPU time


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The `pct` percentile by linear interpolation between closest ranks (numpy's
    default), None for no values: p50 of [1, 2, 3, 4] is 2.5."""
    if not 0 <= pct <= 100:
        raise ValueError(f"pct: {pct!r} is not in [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def share_pct(part_us: int, whole_us: int) -> float:
    """One job's share (per-job ETT%, a run's component share): 0 for no time."""
    return 100.0 * part_us / whole_us if whole_us > 0 else 0.0


def group_share_pct(part_gpu_us: int, whole_gpu_us: int) -> float | None:
    """A group's share of its GPU time: None when it has none (no job, so no figure)."""
    return 100.0 * part_gpu_us / whole_gpu_us if whole_gpu_us > 0 else None


def _zeros(keys: Iterable[str]) -> dict[str, int]:
    return dict.fromkeys(keys, 0)


class Totals(msgspec.Struct, kw_only=True, gc=False):
    """A group's sums: integers that add up (and the TTS/TTR values the percentiles need),
    so the sums of two groups are those of their union (`merge`). The nightly rollup
    keeps them per DAG, tenant and model (`rollup.day.DayPart`), and a user who may read
    only some DAGs gets the fleet of those DAGs by adding their parts, never reading a
    job's row again (bench/pages.py). Mutable: an accumulator (`add`, `merge`)."""

    jobs: int = 0
    provisional_jobs: int = 0
    e2e_us: int = 0
    gpu_us: int = 0
    components_us: dict[str, int] = msgspec.field(default_factory=lambda: _zeros(COMPONENTS))
    lost_gpu_us: dict[str, int] = msgspec.field(
        default_factory=lambda: _zeros(LOST_COMPONENTS))
    nof: dict[str, int] = msgspec.field(default_factory=lambda: _zeros(FAILURE_CAUSES))
    failures: int = 0  # every failure, also of a cause this version does not know
    attempts: int = 0
    preempted_attempts: int = 0
    jobs_with_attempts: int = 0
    tts_s: list[float] = msgspec.field(default_factory=list)
    ttr_s: list[float] = msgspec.field(default_factory=list)
    # slow steps (decision 0035): their GPU-microseconds, and the job-days they are known
    # for; a part stored before them decodes with 0 of `jobs` known, so its figure is None
    slow_steps_gpu_us: int = 0
    slow_steps_jobs: int = 0

    def add(self, r: JobDay) -> None:
        self.jobs += 1
        self.provisional_jobs += r.provisional
        self.e2e_us += r.e2e_us
        self.gpu_us += r.e2e_us * r.gpus
        components, lost_gpu = self.components_us, self.lost_gpu_us
        for c, us in r.components_us.items():
            components[c] += us
            if c in lost_gpu:
                lost_gpu[c] += us * r.gpus
        if r.attempts:
            self.attempts += r.attempts
            self.preempted_attempts += r.preempted_attempts
            self.jobs_with_attempts += 1
        if r.tts_us is not None:
            self.tts_s.append(r.tts_us / US_PER_S)
        if r.slow_steps_us is not None:
            self.slow_steps_gpu_us += r.slow_steps_us * r.gpus
            self.slow_steps_jobs += 1
        nof = self.nof
        self.failures += len(r.failures)
        for f in r.failures:
            if f.cause in nof:
                nof[f.cause] += 1
            if f.ttr_us is not None:
                self.ttr_s.append(f.ttr_us / US_PER_S)

    @property
    def effective_gpu_us(self) -> int:
        """The GPU-microseconds of effective training: the GPU time no lost component has
        (a job-day's six components partition its E2E: `job_day.job_day`)."""
        return self.gpu_us - sum(self.lost_gpu_us.values())

    @property
    def slow_steps_known(self) -> bool:
        """Whether every job-day's slow steps are in the sums (none is a row stored before
        them)."""
        return self.slow_steps_jobs == self.jobs

    def merge(self, other: Totals) -> None:
        """Add `other`'s sums to these (`other` is left as it was)."""
        self.jobs += other.jobs
        self.provisional_jobs += other.provisional_jobs
        self.e2e_us += other.e2e_us
        self.gpu_us += other.gpu_us
        for mine, theirs in ((self.components_us, other.components_us),
                             (self.lost_gpu_us, other.lost_gpu_us), (self.nof, other.nof)):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0) + value
        self.failures += other.failures
        self.attempts += other.attempts
        self.preempted_attempts += other.preempted_attempts
        self.jobs_with_attempts += other.jobs_with_attempts
        self.slow_steps_gpu_us += other.slow_steps_gpu_us
        self.slow_steps_jobs += other.slow_steps_jobs
        self.tts_s.extend(other.tts_s)
        self.ttr_s.extend(other.ttr_s)

    def figures(self) -> GroupFigures:
        e2e, attempts, gpu = self.e2e_us, self.attempts, self.gpu_us
        components = {c: self.components_us.get(c, 0) for c in COMPONENTS}
        lost_gpu = {c: self.lost_gpu_us.get(c, 0) for c in LOST_COMPONENTS}
        shares = {c: group_share_pct(self.effective_gpu_us if c == EFFECTIVE else lost_gpu[c],
                                     gpu) for c in COMPONENTS}
        nof = {cause: self.nof.get(cause, 0) for cause in FAILURE_CAUSES}
        nof["total"] = self.failures
        without = nof["total"] - nof["preemption"]
        preempted = self.preempted_attempts
        slow = self.slow_steps_gpu_us if self.slow_steps_known else None
        return GroupFigures(
            jobs=self.jobs,
            provisional_jobs=self.provisional_jobs,
            e2e_s=e2e / US_PER_S,
            effective_s=components[EFFECTIVE] / US_PER_S,
            ett_pct=shares[EFFECTIVE],
            components_s={c: us / US_PER_S for c, us in components.items()},
            shares_pct=shares,
            gpu_hours=gpu / US_PER_H,
            gpu_hours_lost=sum(lost_gpu.values()) / US_PER_H,
            gpu_hours_lost_by_component={c: us / US_PER_H for c, us in lost_gpu.items()},
            tts_p50_s=percentile(self.tts_s, 50), tts_p90_s=percentile(self.tts_s, 90),
            ttr_p50_s=percentile(self.ttr_s, 50), ttr_p90_s=percentile(self.ttr_s, 90),
            nof=nof,
            attempts=attempts,
            attempts_per_job=(attempts / self.jobs_with_attempts
                              if self.jobs_with_attempts else 0.0),
            failures_per_attempt=nof["total"] / attempts if attempts else 0.0,
            failures_per_attempt_without_preemption=(
                without / (attempts - preempted) if attempts > preempted else 0.0),
            gpu_hours_lost_to_slow_steps=None if slow is None else slow / US_PER_H,
            slow_steps_pct_of_effective=(None if slow is None
                                         else group_share_pct(slow, self.effective_gpu_us)),
        )


def aggregate(days: Iterable[JobDay]) -> GroupFigures:
    totals = Totals()
    for d in days:
        totals.add(d)
    return totals.figures()
