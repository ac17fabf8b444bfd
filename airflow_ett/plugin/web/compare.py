"""The comparison of two windows in the UI: `/ett/compare?a=D1..D2&b=D3..D4` (a page) and
`/ett/api/v1/compare?a=...&b=...` (its JSON), what `airflow-ett report --compare` prints
(`rollup.compare`, docs/decisions/0031-regression-compare.md).

Over the DAGs the user may read, like the fleet page: each window's stored parts
(`DailyRollups.window_parts`) of those DAGs only, so a restricted user's comparison is
that of a fleet of just their DAGs. Without `a` and `b`: the last 7 stored days against
the 7 before. A bad window, or one with a day not rolled up, is a 422 naming the
parameter and the value. The API's models mirror `rollup.compare`'s structs field for
field (tests/plugin/web/test_compare.py holds them equal), as `models.py` does the
rollup's.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated, Final, Literal

import msgspec
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict

from airflow_ett.plugin.web import models, pages
from airflow_ett.plugin.web.access import DagScopeDep, fleet_access
from airflow_ett.plugin.web.data import DagScope
from airflow_ett.plugin.web.deps import StoreDep, TodayDep
from airflow_ett.rollup import compare as rc

if TYPE_CHECKING:
    from airflow_ett.store import EttStore

#: Days of each default window: a week against the week before.
DEFAULT_WINDOW_DAYS: Final = 7

router = APIRouter()

WindowQuery = Annotated[str | None, Query(
    max_length=40, description="a window of stored days, D1..D2 (YYYY-MM-DD, both included; "
                               "D alone is one day)")]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Span(_Model):
    first: str
    last: str
    days: int


class Side(_Model):
    ett_pct: float | None
    job_days: int
    provisional_job_days: int
    synthetic_job_days: int
    gpu_hours: float
    gpu_hours_lost: float
    tenants: int
    models: int


class ComponentMove(_Model):
    component: str
    before_pct: float | None
    after_pct: float | None
    ett_points: float | None


class GroupMove(_Model):
    name: str
    points: float
    rate_points: float
    mix_points: float
    before_pct: float | None
    after_pct: float | None
    gpu_hours_before: float
    gpu_hours_after: float


class View(_Model):
    before: Side
    after: Side
    change_points: float | None
    components: list[ComponentMove]
    tenants: list[GroupMove]
    models: list[GroupMove]


class ModelChange(_Model):
    model: str
    change: Literal["entered", "left", "platform"]
    tenants: list[str]
    gpus_before: list[int] | None
    gpus_after: list[int] | None
    gpu_hours_before: float
    gpu_hours_after: float
    before_pct: float | None
    after_pct: float | None
    points: float


class Churn(_Model):
    cohort_points: float
    entered_points: float
    left_points: float


class Comparison(_Model):
    """Fleet ETT% in window `after` against window `before`, split by component, tenant
    and model (each split adds up to the change), as operated (`fleet`) and for the
    models with GPU time in both (`cohort`); the models that entered, left or changed
    platform (the GPU counts their jobs ran with)."""

    scope: models.Scope
    before: Span
    after: Span
    fleet: View
    cohort: View
    cohort_models: int
    churn: Churn | None
    entered: list[ModelChange]
    left: list[ModelChange]
    platform_changed: list[ModelChange]
    platform_unknown: list[str]


def _windows(store: EttStore, a: str | None, b: str | None, today: dt.date
             ) -> tuple[tuple[dt.date, dt.date], tuple[dt.date, dt.date]]:
    """The windows asked for; a missing one is the `DEFAULT_WINDOW_DAYS` before the
    other (`a`), or ending at the newest stored day (`b`)."""
    span = dt.timedelta(days=DEFAULT_WINDOW_DAYS - 1)
    parsed: dict[str, tuple[dt.date, dt.date]] = {}
    for name, text in (("a", a), ("b", b)):
        if text is not None:
            try:
                parsed[name] = rc.parse_window(text)
            except rc.WindowError as exc:
                raise HTTPException(status_code=422, detail=f"{name}: {exc}") from None
    if "b" not in parsed:
        newest = store.daily.last_day()
        last = dt.date.fromisoformat(newest) if newest is not None else today
        if "a" in parsed and parsed["a"][1] >= last:
            last = parsed["a"][1] + dt.timedelta(days=DEFAULT_WINDOW_DAYS)
        parsed["b"] = (last - span, last)
    if "a" not in parsed:
        end = parsed["b"][0] - dt.timedelta(days=1)
        parsed["a"] = (end - span, end)
    return parsed["a"], parsed["b"]


def comparison(store: EttStore, a: str | None, b: str | None, scope: DagScope,
               today: dt.date) -> Comparison:
    """The comparison over the DAGs `scope` allows (422 for a window not stored)."""
    windows = []
    for name, (first, last) in zip(("a", "b"), _windows(store, a, b, today), strict=True):
        by_day = store.daily.window_parts(first.isoformat(), last.isoformat())
        readable = {day: [p for p in parts if scope.allows(p.dag_id)]
                    for day, parts in by_day.items()}
        try:
            windows.append(rc.window(first, last, readable))
        except rc.WindowError as exc:
            raise HTTPException(status_code=422, detail=f"{name}: {exc}") from None
    result = rc.compare(windows[0], windows[1])
    return Comparison.model_validate({**msgspec.to_builtins(result), "scope": scope.model()})


@router.get("/api/v1/compare", dependencies=[Depends(fleet_access)], tags=["ETT"],
            summary="What moved fleet ETT% between two windows")
def get_compare(store: StoreDep, scope: DagScopeDep, today: TodayDep,
                a: WindowQuery = None, b: WindowQuery = None) -> Comparison:
    """Window `b` against window `a` (default: the last 7 stored days against the 7
    before), over the DAGs the caller may read."""
    return comparison(store, a, b, scope, today)


@router.get("/compare", name="compare_page", dependencies=[Depends(fleet_access)],
            include_in_schema=False)
def compare_page(request: Request, store: StoreDep, scope: DagScopeDep, today: TodayDep,
                 a: WindowQuery = None, b: WindowQuery = None) -> HTMLResponse:
    c = comparison(store, a, b, scope, today)
    same = not c.entered and not c.left
    return pages.render(request, "compare.html.j2", c=c, same=same,
                        views=[("fleet", "The fleet as operated", c.fleet)]
                        + ([] if same else [("cohort", "The fixed cohort (models that ran "
                                                       "in both windows)", c.cohort)]))
