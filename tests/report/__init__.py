"""Rollups and timelines for the report tests, built the way the nightly run builds them
(events -> attribution -> job-days -> `rollup_day`), so the page shows real figures.

`hand_days()`: days D-1 and D of tests/rollup/scenarios.py, whose figures are worked out
on paper in tests/rollup/test_day.py (fleet ETT% on D is 7500/8500 GPU-s = 88.2%, on D-1
job A's first hour, 3000/3600 = 83.3%). `small_fleet()`: three days of simulated jobs
(`airflow_ett.ett.synthetic.simulate`) with failures of every cause, one job across
midnight, one still running, and a tenant whose name is an HTML injection.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import msgspec

from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.events import Event, FailureCause, JobSubmitted
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.report.timeline import RunTimeline, run_timeline
from airflow_ett.rollup import DayRollup, DayWindow, day_window, job_day, load_components
from airflow_ett.rollup import rollup_day as _rollup_day
from tests.rollup.scenarios import PREVIOUS, WINDOW, D, job_a, job_b

EVIL = "<script>alert(1)</script>"
EVIL_JOB = '<img src=x onerror="alert(2)">'


def rollup(window: DayWindow, attributions: Sequence[JobAttribution], *,
           synthetic: bool = False) -> DayRollup:
    days = [job_day(a, window, gpus=a.world_size, synthetic=synthetic) for a in attributions]
    return _rollup_day(window, [d for d in days if d is not None], load_components(),
                       computed_at=window.hi + 60)


def hand_days() -> tuple[list[DayRollup], list[RunTimeline]]:
    a, b = attribute_job(job_a()), attribute_job(job_b())
    return [rollup(PREVIOUS, [a, b]), rollup(WINDOW, [a, b])], [run_timeline(b)]


def retenant(events: Sequence[Event], tenant: str) -> list[Event]:
    """The events with the submission's tenant replaced (an injection for the tests)."""
    return [msgspec.structs.replace(e, tenant=tenant) if isinstance(e, JobSubmitted) else e
            for e in events]


FLEET_DAYS = tuple(D + dt.timedelta(days=k) for k in (-2, -1, 0))


def _specs() -> list[JobSpec]:
    """Three days of jobs: hours long, 8..64 GPUs, failures of each cause."""
    tenants = ("ads-ranking", "search", "feeds", EVIL)
    models = ("dlrm_small", "dlrm_large", "two_tower")
    specs = []
    for k, day in enumerate(FLEET_DAYS):
        lo = day_window(day, "UTC").lo
        for j in range(5):
            failures: tuple[InjectedFailure, ...] = ()
            causes: tuple[FailureCause | None, ...] = ("preemption", "infra", "application",
                                                       "unknown", None)
            cause = causes[(j + k) % 5]
            if cause is not None:
                failures = (InjectedFailure(at_step=180 + 40 * j, cause=cause,
                                            detection_s=30.0 + 200 * (cause == "infra"),
                                            shutdown_s=20.0, reschedule_s=240.0),)
            if j == 0 and k == 1:  # two failures: the worst run of its day
                failures = (InjectedFailure(at_step=120, cause="infra", detection_s=600.0,
                                            shutdown_s=60.0, reschedule_s=900.0),
                            InjectedFailure(at_step=300, cause="preemption", detection_s=5.0,
                                            shutdown_s=30.0, reschedule_s=600.0))
            specs.append(JobSpec(
                job=f"sim-{day:%m%d}-{j}", tenant=tenants[(j + k) % len(tenants)],
                model=models[j % len(models)], dag_id=f"sim_{models[j % len(models)]}",
                submit_ts=lo + 3600 * (2 + 4 * j) + 600 * k,
                queue_s=120.0 + 300 * j, world_size=(8, 16, 32, 64, 8)[j],
                startup=(("trainer_init", 20.0), ("data_pipeline_init", 90.0),
                         ("model_creation", 45.0), ("compile", 300.0 + 120 * j)),
                restore_s=60.0, steps=400 + 100 * j, step_s=20.0 + 5 * k, batch=256,
                progress_every=10, checkpoint_every=100, checkpoint_blocking_s=30.0,
                checkpoint_total_s=90.0, final_checkpoint_s=60.0, teardown_s=30.0,
                failures=failures))
    # One across the last midnight, still running when the report is made.
    last = day_window(FLEET_DAYS[-1], "UTC")
    specs.append(JobSpec(job="sim-running", tenant="search", model="dlrm_large",
                         dag_id="sim_dlrm_large", submit_ts=last.lo - 5400, queue_s=300.0,
                         world_size=16, steps=2000, step_s=30.0, checkpoint_every=200,
                         running_until_step=1200, restore_s=60.0,
                         failures=(InjectedFailure(at_step=500, cause="preemption",
                                                   detection_s=5.0, shutdown_s=30.0,
                                                   reschedule_s=900.0),)))
    return specs


def small_fleet(timelines: int = 3) -> tuple[list[DayRollup], list[RunTimeline]]:
    """The three days' rollups and the timelines of the last day's worst runs."""
    last = day_window(FLEET_DAYS[-1], "UTC")
    now = last.lo + 12 * 3600
    attributions = {}
    for spec in _specs():
        events = [e for e in simulate(spec) if e.ts <= now]
        if events:  # a job submitted after `now` has not happened yet
            attributions[spec.job] = attribute_job(events, now=now)
    windows = [day_window(day, "UTC") for day in FLEET_DAYS]
    days = [rollup(w, list(attributions.values()), synthetic=True) for w in windows]
    worst = [r.job for r in days[-1].top_runs[:timelines]]
    return days, [run_timeline(attributions[job]) for job in worst]
