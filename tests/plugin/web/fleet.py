"""A small fleet for the page tests (unit and end-to-end): four jobs over three days, made
by the one-job simulator (`airflow_ett.ett.synthetic`) so they attribute as a trainer's do.

  job           DAG               day                        GPUs  what happens
  A1            ett_pages_ranking  day 1 -> day 2 (midnight)  8     an infra failure; publishes
  B1            ett_pages_secret   day 2                      4     a preemption
  C1            (none: the CLI)    day 1                      2     clean; tenant is markup
  A2 (running)  ett_pages_ranking  the day of `now`           8     still training at `now`

`ett_pages_secret` is the DAG the restricted user may not read (restricted_auth.py).
The store is seeded, then rolled up by `DailyRollups.compute` as the nightly DAG does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

from airflow_ett.ett.events import Event, ModelPublished
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.jobs import job_id_for
from airflow_ett.rollup import DayRollup, day_of, day_window, load_components, windows
from airflow_ett.store import EttStore

DAG_A: Final = "ett_pages_ranking"
DAG_SECRET: Final = "ett_pages_secret"
MARKUP_TENANT: Final = "<i>research</i>"
MODEL_URI: Final = "s3://models/ads-ranking/dlrm_small/a1"
_STARTUP: Final = (("trainer_init", 20.0), ("data_pipeline_init", 90.0),
                   ("model_creation", 45.0), ("compile", 300.0))


#: How long before `now` the running job A2 was submitted: before 02:00 UTC it began on
#: the day before `now`'s, and counts there too.
RUNNING_FOR_S: Final = 7200.0


@dataclass(frozen=True)
class Fleet:
    lo1: float  # midnight UTC that starts day 1
    now: float
    running_run_id: str
    days: list[DayRollup]

    @property
    def first(self) -> dt.date:
        return dt.datetime.fromtimestamp(self.lo1, tz=dt.UTC).date()

    @property
    def last(self) -> dt.date:
        return day_of(self.now, "UTC")


def _spec(dag: str | None, run: str, **kw: Any) -> JobSpec:
    job = job_id_for(dag, run) if dag else run
    return JobSpec(job=job, dag_id=dag, run_id=run if dag else None, startup=_STARTUP,
                   restore_s=60.0, progress_every=30, checkpoint_every=200,
                   checkpoint_blocking_s=20.0, checkpoint_total_s=60.0,
                   final_checkpoint_s=45.0, teardown_s=30.0, **kw)


def specs(lo1: float, now: float, running_run_id: str) -> list[JobSpec]:
    lo2 = lo1 + 86400
    return [
        _spec(DAG_A, "scheduled__a1", tenant="ads-ranking", model="dlrm_small",
              submit_ts=lo2 - 7200, queue_s=240.0, world_size=8, steps=1200, step_s=10.0,
              failures=(InjectedFailure(at_step=500, cause="infra", detection_s=300.0,
                                        shutdown_s=40.0, reschedule_s=420.0),)),
        _spec(DAG_SECRET, "manual__b1", tenant="search", model="two_tower",
              submit_ts=lo2 + 3 * 3600, queue_s=600.0, world_size=4, steps=600, step_s=8.0,
              failures=(InjectedFailure(at_step=300, cause="preemption", detection_s=5.0,
                                        shutdown_s=30.0, reschedule_s=900.0),)),
        _spec(None, "cli-c1", tenant=MARKUP_TENANT, model="dlrm_small",
              submit_ts=lo1 + 5 * 3600, queue_s=60.0, world_size=2, steps=400, step_s=6.0),
        _spec(DAG_A, running_run_id, tenant="ads-ranking", model="dlrm_small",
              submit_ts=now - RUNNING_FOR_S, queue_s=120.0, world_size=8, steps=4000,
              step_s=5.0,
              running_until_step=1260),
    ]


def events(lo1: float, now: float, running_run_id: str = "manual__a2") -> list[Event]:
    out: list[Event] = []
    for spec in specs(lo1, now, running_run_id):
        job_events = simulate(spec)
        if spec.run_id == "scheduled__a1":  # the finished ranking job publishes its model
            end = max(e.ts for e in job_events)
            job_events.append(ModelPublished(id=f"{spec.job}-published", job=spec.job,
                                             ts=end + 90.0, uri=MODEL_URI))
        out += job_events
    return out


def seed(store: EttStore, lo1: float, now: float, running_run_id: str = "manual__a2") -> Fleet:
    """Write the fleet's events into `store` and roll its days up (day 1 to `now`'s)."""
    store.insert_events(events(lo1, now, running_run_id))
    first = dt.datetime.fromtimestamp(lo1, tz=dt.UTC).date()
    days = store.daily.compute(windows(first, day_of(now, "UTC"), "UTC"), load_components(),
                               now=now)
    return Fleet(lo1=lo1, now=now, running_run_id=running_run_id, days=days)


#: The unit tests' fixed calendar: day 1 is 2026-11-26; `now` is 20:00 on 2026-11-28.
DAY1: Final = dt.date(2026, 11, 26)
LO1: Final = day_window(DAY1, "UTC").lo
NOW: Final = LO1 + 2 * 86400 + 20 * 3600
