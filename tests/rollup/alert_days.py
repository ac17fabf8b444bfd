"""Days of a small fleet for the alert tests, built as the rollup builds them (job-days ->
`rollup_day`) from job-days whose seconds are chosen by hand.

Every job runs 10,000 s on its GPUs. The baseline days: tenants `ads` and `search`, models
`ctr` and `rank`, initialization 0.5% of each job. The bad day: `ads`'s `ctr` jobs spend
5% in initialization (a regression and a breach of the bundled `<1%` SLO), `search` is
unchanged, and a new model `fresh` (tenant `search`) enters.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup import DayRollup, day_window, rollup_day
from airflow_ett.rollup.components import ComponentsConfig
from airflow_ett.rollup.job_day import JobDay

BAD_DAY = dt.date(2026, 11, 28)
E2E_S = 10_000


def job(name: str, tenant: str, model: str, gpus: int, lost_s: Mapping[str, float]
        ) -> JobDay:
    us = {c: round(lost_s.get(c, 0.0) * 1e6) for c in COMPONENTS if c != EFFECTIVE}
    us[EFFECTIVE] = E2E_S * 1_000_000 - sum(us.values())
    return JobDay(job=name, tenant=tenant, model=model, dag_id=model, run_id=name, gpus=gpus,
                  provisional=False, synthetic=False, e2e_us=E2E_S * 1_000_000,
                  components_us={c: us[c] for c in COMPONENTS}, tts_us=None, failures=(),
                  attempts=1, preempted_attempts=0)


def day(date: dt.date, jobs: list[JobDay], components: ComponentsConfig) -> DayRollup:
    window = day_window(date, "UTC")
    return rollup_day(window, jobs, components, computed_at=window.hi + 60)


def baseline_day(date: dt.date, components: ComponentsConfig) -> DayRollup:
    return day(date, [job(f"a-{date}", "ads", "ctr", 8, {"initialization": 50}),
                      job(f"s-{date}", "search", "rank", 8, {"initialization": 50})],
               components)


def bad_day(components: ComponentsConfig) -> DayRollup:
    return day(BAD_DAY, [job("a-bad", "ads", "ctr", 8, {"initialization": 500}),
                         job("s-bad", "search", "rank", 8, {"initialization": 50}),
                         job("f-bad", "search", "fresh", 8, {"initialization": 50})],
               components)


def baseline(components: ComponentsConfig, days: int = 3) -> list[DayRollup]:
    return [baseline_day(BAD_DAY - dt.timedelta(days=k), components)
            for k in range(1, days + 1)]
