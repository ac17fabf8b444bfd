"""Two weeks of a small fleet for the comparison tests, figures worked out on paper.

Every job runs 10,000 s (`alert_days.job`), one job per model a day (GPU-seconds a day):

| model (tenant)  | week 1 (Nov 1-7)                     | week 2 (Nov 8-14)                  |
|-----------------|--------------------------------------|------------------------------------|
| ctr (ads)       | 8 GPUs, init 50 s, scheduling 300 s  | 8 GPUs, init 500 s, scheduling 300 |
| rank (search)   | 8 GPUs, compilation 200 s            | 16 GPUs, the same                  |
| old (search)    | 4 GPUs, wasted 1000 s                | (left)                             |
| fresh (search)  | (not yet)                            | 4 GPUs, wasted 2000 s (entered)    |

Week 1: 200,000 GPU-s a day, 8,400 lost: ETT% 95.8. Week 2: 280,000, 17,600 lost:
ETT% 93.714..., a change of -2.0857 points. The cohort (ctr, rank): 97.25 -> 96.0.
"""

from __future__ import annotations

import datetime as dt

from airflow_ett.rollup import DayPart, JobDay, day_parts, day_window, rollup_of_parts
from airflow_ett.rollup.compare import PartSums, sums_of
from airflow_ett.rollup.components import ComponentsConfig
from airflow_ett.store import EttStore
from tests.rollup.alert_days import job

WEEK_1 = dt.date(2026, 11, 1)
WEEK_2 = dt.date(2026, 11, 8)


def jobs_of(day: dt.date) -> list[JobDay]:
    second = day >= WEEK_2
    n = day.isoformat()
    return [job(f"c-{n}", "ads", "ctr", 8,
                {"initialization": 500 if second else 50, "scheduling": 300}),
            job(f"r-{n}", "search", "rank", 16 if second else 8, {"compilation": 200}),
            job(f"o-{n}", "search", "fresh" if second else "old", 4,
                {"wasted_training": 2000 if second else 1000})]


def parts_of(day: dt.date) -> list[DayPart]:
    return day_parts(jobs_of(day), cut_pct=50.0, start_s=60.0)


def week(first: dt.date) -> list[PartSums]:
    """A week's parts as a comparison reads them."""
    return [sums_of(p) for i in range(7) for p in parts_of(first + dt.timedelta(days=i))]


def store_days(store: EttStore, components: ComponentsConfig, first: dt.date = WEEK_1,
               days: int = 14) -> None:
    """The days stored as the nightly rollup stores them (day, parts, job rows)."""
    for i in range(days):
        day = first + dt.timedelta(days=i)
        window = day_window(day, "UTC")
        jobs = jobs_of(day)
        parts = day_parts(jobs, cut_pct=50.0, start_s=60.0)
        store.daily.replace(rollup_of_parts(window, parts, components,
                                            computed_at=window.hi + 60), jobs, parts)
