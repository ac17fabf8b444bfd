"""The JSON API behind the pages: `/ett/api/v1/...`, described by `/ett/openapi.json`.

Each route returns the model its page renders (`models.py`), computed by `data.py`; the
access rules are `access.py`'s (the app adds `signed_in` to every route). Errors are JSON
`{"detail": ...}`: 401 not signed in, 403 not allowed, 404 no such run in the ETT store,
422 a bad parameter, 503 the store cannot be read.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from airflow_ett.plugin.web import data, models
from airflow_ett.plugin.web.access import DagScopeDep, fleet_access, run_access
from airflow_ett.plugin.web.deps import NowDep, StoreDep, TodayDep

router = APIRouter(prefix="/api/v1", tags=["ETT"])

FromQuery = Annotated[dt.date | None, Query(
    alias="from", description="first day, YYYY-MM-DD (default: 13 days before `to`)")]
ToQuery = Annotated[dt.date | None, Query(
    alias="to", description="last day, included (default: today in [ett] rollup_timezone, "
                            "or 13 days after `from`)")]
FiguresQuery = Annotated[bool, Query(description="include the plotly figure specs")]
JobQuery = Annotated[str | None, Query(
    max_length=1000, description="the job id, for a job not named `<dag_id>__<run_id>` (a "
                                 "simulated one); it must be a job of this DAG run")]


def days_or_422(first: dt.date | None, last: dt.date | None,
                today: dt.date) -> tuple[dt.date, dt.date]:
    try:
        return data.days_asked(first, last, today)
    except data.DaysError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None


def run_or_404(store: StoreDep, dag_id: str, run_id: str, now: float,
               figures: bool, job: str | None = None) -> models.Run:
    try:
        found = data.run(store, dag_id, run_id, now=now, figures=figures, job=job)
    except data.RunUnreadable as exc:
        raise HTTPException(status_code=500, detail=str(exc)) from None
    if found is None:
        raise HTTPException(status_code=404, detail=(
            f"no ETT events recorded for run {run_id!r} of DAG {dag_id!r} (is it a "
            "training DAG with the `ett` tag?)"))
    return found


@router.get("/fleet", dependencies=[Depends(fleet_access)], summary="Fleet ETT by day")
def get_fleet(store: StoreDep, scope: DagScopeDep, today: TodayDep,
              first: FromQuery = None, last: ToQuery = None,
              figures: FiguresQuery = False) -> models.Fleet:
    """The stored daily rollups in `[from, to]`: the trend, and the last day's components
    with owners and SLO status, teams, tenants, what-if and worst runs; computed over the
    DAGs the caller may read."""
    lo, hi = days_or_422(first, last, today)
    return data.fleet(store, lo, hi, scope, figures=figures)


@router.get("/runs/{dag_id}/{run_id:path}", dependencies=[Depends(run_access)],
            summary="One DAG run's ETT breakdown")
def get_run(dag_id: str, run_id: str, store: StoreDep, now: NowDep,
            figures: FiguresQuery = False, job: JobQuery = None) -> models.Run:
    """The run's attempts, Level 1 and Level 2, phases, timeline and published model; for
    a run still going, its provisional figures and its rolling windows (its ETT% and
    components over each of its last `[ett] rolling_windows` minutes)."""
    return run_or_404(store, dag_id, run_id, now, figures, job)
