"""The figures of one group of job-days (the fleet, a tenant, a model) for one day.

Weighting: ETT% and the component shares are seconds over seconds, summed over the
group's jobs, so a long job weighs more than a short one (the fleet's ETT% is the share
of all its wall time that trained on new data, not a mean of per-job percentages).
GPU-hours weigh each second by the job's world size. Sums are taken in integer
microseconds (GPU-microseconds) and turned into seconds and hours only at the end, so
the tenants' GPU-hours add up to the fleet's exactly as the integers do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

from airflow_ett.ett.events import FAILURE_CAUSES
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup.job_day import JobDay

US_PER_S = 1_000_000
US_PER_H = 3600 * US_PER_S


class GroupFigures(msgspec.Struct, frozen=True, kw_only=True):
    jobs: int
    provisional_jobs: int
    e2e_s: float
    effective_s: float
    ett_pct: float
    components_s: dict[str, float]
    shares_pct: dict[str, float]
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
    return 100.0 * part_us / whole_us if whole_us > 0 else 0.0


def aggregate(days: Iterable[JobDay]) -> GroupFigures:
    rows = list(days)
    e2e = sum(r.e2e_us for r in rows)
    components = {c: sum(r.components_us[c] for r in rows) for c in COMPONENTS}
    gpu = sum(r.gpu_us for r in rows)
    lost_gpu = {c: sum(r.components_us[c] * r.gpus for r in rows)
                for c in COMPONENTS if c != EFFECTIVE}
    failures = [f for r in rows for f in r.failures]
    nof = {cause: sum(1 for f in failures if f.cause == cause) for cause in FAILURE_CAUSES}
    nof["total"] = len(failures)
    attempts = sum(r.attempts for r in rows)
    preempted = sum(r.preempted_attempts for r in rows)
    jobs_with_attempts = sum(1 for r in rows if r.attempts)
    tts = [r.tts_us / US_PER_S for r in rows if r.tts_us is not None]
    ttr = [f.ttr_us / US_PER_S for f in failures if f.ttr_us is not None]
    without = nof["total"] - nof["preemption"]
    return GroupFigures(
        jobs=len(rows),
        provisional_jobs=sum(1 for r in rows if r.provisional),
        e2e_s=e2e / US_PER_S,
        effective_s=components[EFFECTIVE] / US_PER_S,
        ett_pct=share_pct(components[EFFECTIVE], e2e),
        components_s={c: us / US_PER_S for c, us in components.items()},
        shares_pct={c: share_pct(us, e2e) for c, us in components.items()},
        gpu_hours=gpu / US_PER_H,
        gpu_hours_lost=sum(lost_gpu.values()) / US_PER_H,
        gpu_hours_lost_by_component={c: us / US_PER_H for c, us in lost_gpu.items()},
        tts_p50_s=percentile(tts, 50), tts_p90_s=percentile(tts, 90),
        ttr_p50_s=percentile(ttr, 50), ttr_p90_s=percentile(ttr, 90),
        nof=nof,
        attempts=attempts,
        attempts_per_job=attempts / jobs_with_attempts if jobs_with_attempts else 0.0,
        failures_per_attempt=nof["total"] / attempts if attempts else 0.0,
        failures_per_attempt_without_preemption=(
            without / (attempts - preempted) if attempts > preempted else 0.0),
    )
