"""The fleet rollup: one calendar day's ETT figures for the fleet, each tenant, model and
owning team, with SLO status, what-if and the worst runs. Pure logic (no Airflow, SQL or
torch): the store reads the jobs and keeps the rows, the CLI and the nightly DAG drive it.

Stages: `calendar` (days in a time zone as `[lo, hi)` windows), `job_day` (one job's part
of one day, cut from its timeline), `figures` (a group's figures from its job-days),
`whatif`, `parts` (sums of one DAG's jobs that add up to any union of DAGs),
`components` (owners and SLOs, from a validated TOML file), `day` (all of it as
`DayRollup`). docs/decisions/0010-rollup-days.md says how a day splits a job.
"""

from airflow_ett.rollup.calendar import CalendarError, DayWindow, day_of, day_window, days, windows
from airflow_ett.rollup.components import (
    ComponentPolicy,
    ComponentsConfig,
    ComponentsError,
    load_components,
)
from airflow_ett.rollup.day import DayRollup, SloRow, TeamFigures, rollup_day, rollup_of_parts
from airflow_ett.rollup.figures import GroupFigures, Totals, aggregate, percentile
from airflow_ett.rollup.job_day import FailureInDay, JobDay, job_day
from airflow_ett.rollup.parts import DayPart, RunLoss, day_parts
from airflow_ett.rollup.whatif import Savings, WhatIf, what_ifs

__all__ = [
    "CalendarError", "ComponentPolicy", "ComponentsConfig", "ComponentsError", "DayPart",
    "DayRollup", "DayWindow", "FailureInDay", "GroupFigures", "JobDay", "RunLoss", "Savings",
    "SloRow", "TeamFigures", "Totals", "WhatIf", "aggregate", "day_of", "day_parts",
    "day_window", "days", "job_day", "load_components", "percentile", "rollup_day",
    "rollup_of_parts", "what_ifs", "windows",
]
