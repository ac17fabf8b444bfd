"""One day's rollup: the fleet, each tenant, model and owning team, SLOs, what-if and the
worst runs, from the day's job-days. `DayRollup` is what the store keeps (as JSON, beside
the per-group and per-job rows the pages query) and what every report renders.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Final

import msgspec

from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup.calendar import DayWindow
from airflow_ett.rollup.components import ComponentPolicy, ComponentsConfig, SloStatus
from airflow_ett.rollup.figures import US_PER_H, GroupFigures, aggregate, share_pct
from airflow_ett.rollup.job_day import JobDay
from airflow_ett.rollup.whatif import WhatIf, what_ifs

#: The JSON form's version (fields are only added, with defaults; see ett/summary.py).
ROLLUP_VERSION: Final = 1
TOP_RUNS: Final = 10


class TeamFigures(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    components: list[str]
    share_pct: float  # of the fleet's E2E: the time in the components the team owns
    gpu_hours_lost: float
    breaches: list[str]  # the owned components whose SLO the day missed


class SloRow(msgspec.Struct, frozen=True, kw_only=True):
    component: str
    owner: str
    target: str
    share_pct: float
    gpu_hours_lost: float
    status: SloStatus
    # the bounds behind `target`, so that a reader can judge another share (a tenant's) by
    # the same rule (`policy()`); added after the first rows, hence the defaults
    max_share_pct: float | None = None
    min_share_pct: float | None = None

    def policy(self) -> ComponentPolicy:
        return ComponentPolicy(self.component, self.owner, max_share_pct=self.max_share_pct,
                               min_share_pct=self.min_share_pct)


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


class DayRollup(msgspec.Struct, frozen=True, kw_only=True):
    day: str
    tz: str
    lo: float
    hi: float
    computed_at: float
    provisional: bool  # some job in it still runs: its figures may still change
    synthetic_jobs: int
    fleet: GroupFigures
    tenants: dict[str, GroupFigures]
    models: dict[str, GroupFigures]
    teams: list[TeamFigures]
    slo: list[SloRow]
    what_if: list[WhatIf]
    top_runs: list[RunLoss]
    components_file: str
    version: int = ROLLUP_VERSION

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


def _by(days: Sequence[JobDay], key: Callable[[JobDay], str]) -> dict[str, GroupFigures]:
    groups: dict[str, list[JobDay]] = defaultdict(list)
    for d in days:
        groups[key(d)].append(d)
    return {name: aggregate(groups[name]) for name in sorted(groups)}


def _run_loss(d: JobDay) -> RunLoss:
    lost = {c: us for c, us in d.components_us.items() if c != EFFECTIVE}
    worst = max(COMPONENTS, key=lambda c: (lost.get(c, -1), -COMPONENTS.index(c)))
    return RunLoss(job=d.job, tenant=d.tenant, model=d.model, dag_id=d.dag_id, run_id=d.run_id,
                   gpus=d.gpus, gpu_hours=d.gpu_us / US_PER_H,
                   gpu_hours_lost=d.lost_gpu_us / US_PER_H,
                   ett_pct=share_pct(d.effective_us, d.e2e_us), worst_component=worst,
                   provisional=d.provisional)


def _slo(fleet: GroupFigures, components: ComponentsConfig) -> list[SloRow]:
    rows = []
    for c in COMPONENTS:
        policy = components.policies[c]
        share = fleet.shares_pct[c]
        rows.append(SloRow(component=c, owner=policy.owner, target=policy.target,
                           max_share_pct=policy.max_share_pct,
                           min_share_pct=policy.min_share_pct, share_pct=share,
                           gpu_hours_lost=fleet.gpu_hours_lost_by_component.get(c, 0.0),
                           status=policy.status(share) if fleet.e2e_s > 0 else "none"))
    return rows


def _teams(slo: list[SloRow], components: ComponentsConfig) -> list[TeamFigures]:
    by_component = {row.component: row for row in slo}
    teams = [
        TeamFigures(team=team, components=list(owned),
                    share_pct=sum(by_component[c].share_pct for c in owned),
                    gpu_hours_lost=sum(by_component[c].gpu_hours_lost for c in owned),
                    breaches=[c for c in owned if by_component[c].status == "breach"])
        for team, owned in components.teams().items()
    ]
    return sorted(teams, key=lambda t: (-t.gpu_hours_lost, t.team))


def rollup_day(window: DayWindow, job_days: Iterable[JobDay], components: ComponentsConfig, *,
               computed_at: float, cut_pct: float = 50.0, start_s: float = 60.0,
               top: int = TOP_RUNS) -> DayRollup:
    """The day's figures. Jobs are taken in job-id order, so the result does not depend
    on the order the store returned them in."""
    days = sorted(job_days, key=lambda d: d.job)
    fleet = aggregate(days)
    slo = _slo(fleet, components)
    worst = sorted(days, key=lambda d: (-d.lost_gpu_us, d.job))[:top]
    return DayRollup(
        day=window.iso, tz=window.tz, lo=window.lo, hi=window.hi, computed_at=computed_at,
        provisional=any(d.provisional for d in days),
        synthetic_jobs=sum(1 for d in days if d.synthetic),
        fleet=fleet,
        tenants=_by(days, lambda d: d.tenant),
        models=_by(days, lambda d: d.model or "-"),
        teams=_teams(slo, components),
        slo=slo,
        what_if=what_ifs(days, cut_pct=cut_pct, start_s=start_s),
        top_runs=[_run_loss(d) for d in worst if d.lost_gpu_us > 0],
        components_file=components.source,
    )
