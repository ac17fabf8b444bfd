"""A day's parts: the sums of one DAG's jobs of one tenant and model, which add up to any
union of them.

Why: a user who may read only some DAGs sees the fleet of those DAGs (the pages'
access rule). Recomputing it from every readable job-day (reading the row, then the
figures) cost 269-353 ms p95 for a new user's two-week view of about 22,000 readable
job-days (bench/pages.py), growing with the fleet. Every figure of a group is a function
of sums that add up (`figures.Totals`, `whatif.Savings`) and of its worst runs (the worst
of a union are among the worst of its parts), so the nightly rollup keeps one part per
(DAG, tenant, model) and such a user's day is the merge of the readable parts: work in
the number of DAGs (and the TTS/TTR values the percentiles sort), not jobs.
`day.rollup_day` is itself the merge of all of a day's parts, so the stored day and a
fully readable merge are one computation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup.figures import US_PER_H, Totals, share_pct
from airflow_ett.rollup.job_day import JobDay
from airflow_ett.rollup.whatif import Savings

TOP_RUNS: Final = 10


class RunLoss(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    tenant: str
    model: str
    dag_id: str | None
    run_id: str | None
    gpus: int
    gpu_hours: float
    gpu_hours_lost: float
    ett_pct: float
    worst_component: str  # the lost-time component with the most seconds that day
    provisional: bool


class WorstRun(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A run among a part's worst, with the exact GPU-microseconds it is ranked by."""

    lost_gpu_us: int
    run: RunLoss


class DayPart(msgspec.Struct, kw_only=True, gc=False):
    """One (DAG, tenant, model)'s share of a day."""

    dag_id: str | None  # None: jobs sent with no DAG (by the CLI, say)
    tenant: str
    model: str
    synthetic_jobs: int = 0
    silent_jobs: int = 0
    totals: Totals
    savings: Savings
    worst: list[WorstRun] = msgspec.field(default_factory=list)  # the worst first
    # job-days by GPU count (world size): how the jobs ran, for `compare`'s "changed
    # platform"; empty in a part stored before it was kept (its day's job rows have it)
    gpu_counts: dict[int, int] = msgspec.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dag_id or "", self.tenant, self.model)


def run_loss(d: JobDay) -> RunLoss:
    lost = {c: us for c, us in d.components_us.items() if c != EFFECTIVE}
    worst = max(COMPONENTS, key=lambda c: (lost.get(c, -1), -COMPONENTS.index(c)))
    return RunLoss(job=d.job, tenant=d.tenant, model=d.model, dag_id=d.dag_id, run_id=d.run_id,
                   gpus=d.gpus, gpu_hours=d.gpu_us / US_PER_H,
                   gpu_hours_lost=d.lost_gpu_us / US_PER_H,
                   ett_pct=share_pct(d.effective_us, d.e2e_us), worst_component=worst,
                   provisional=d.provisional)


def worst_runs(runs: Iterable[WorstRun], top: int) -> list[WorstRun]:
    """The `top` runs that lost the most GPU-time (ties by job id), none that lost nothing."""
    ranked = sorted((w for w in runs if w.lost_gpu_us > 0),
                    key=lambda w: (-w.lost_gpu_us, w.run.job))
    return ranked[:top]


def day_parts(job_days: Iterable[JobDay], *, cut_pct: float, start_s: float,
              top: int = TOP_RUNS) -> list[DayPart]:
    """The day's parts, in key order, each keeping its `top` worst runs."""
    parts: dict[tuple[str | None, str, str], DayPart] = {}
    candidates: dict[tuple[str | None, str, str], list[JobDay]] = {}
    for d in job_days:
        key = (d.dag_id, d.tenant, d.model)
        part = parts.get(key)
        if part is None:
            part = parts[key] = DayPart(dag_id=d.dag_id, tenant=d.tenant, model=d.model,
                                        totals=Totals(),
                                        savings=Savings(cut_pct=cut_pct, start_s=start_s))
            candidates[key] = []
        part.totals.add(d)
        part.savings.add(d)
        part.synthetic_jobs += d.synthetic
        part.silent_jobs += d.silent
        part.gpu_counts[d.gpus] = part.gpu_counts.get(d.gpus, 0) + 1
        if d.lost_gpu_us > 0:
            candidates[key].append(d)
    for key, part in parts.items():
        ranked = sorted(candidates[key], key=lambda d: (-d.lost_gpu_us, d.job))[:top]
        part.worst = [WorstRun(lost_gpu_us=d.lost_gpu_us, run=run_loss(d)) for d in ranked]
    return sorted(parts.values(), key=lambda p: p.key)
