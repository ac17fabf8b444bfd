"""One day's rollup: the fleet, each tenant, model and owning team, SLOs, what-if and the
worst runs, from the day's job-days (through its parts: `parts.py`). `DayRollup` is what
the store keeps (as JSON, beside the per-part, per-group and per-job rows the pages
query) and what every report renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.rollup.calendar import DayWindow
from airflow_ett.rollup.components import ComponentPolicy, ComponentsConfig, SloStatus
from airflow_ett.rollup.figures import GroupFigures, Totals
from airflow_ett.rollup.job_day import JobDay
from airflow_ett.rollup.parts import TOP_RUNS, DayPart, RunLoss, day_parts, worst_runs
from airflow_ett.rollup.whatif import Savings, WhatIf

#: The JSON form's version (fields are only added, with defaults; see ett/summary.py).
#: 2: ETT% and shares are GPU-seconds over GPU-seconds, None for no GPU time (version 1
#: weighed seconds; store migration 0003 rewrote the stored days, decision 0010).
ROLLUP_VERSION: Final = 2


class TeamFigures(msgspec.Struct, frozen=True, kw_only=True):
    team: str
    components: list[str]
    share_pct: float | None  # of the fleet's GPU time, in the components the team owns
    gpu_hours_lost: float
    breaches: list[str]  # the owned components whose SLO the day missed


class SloRow(msgspec.Struct, frozen=True, kw_only=True):
    component: str
    owner: str
    target: str
    share_pct: float | None  # of the fleet's GPU time; None: no GPU time (status "none")
    gpu_hours_lost: float
    status: SloStatus
    # the bounds behind `target`, so that a reader can judge another share (a tenant's) by
    # the same rule (`policy()`); added after the first rows, hence the defaults
    max_share_pct: float | None = None
    min_share_pct: float | None = None

    def policy(self) -> ComponentPolicy:
        return ComponentPolicy(self.component, self.owner, max_share_pct=self.max_share_pct,
                               min_share_pct=self.min_share_pct)


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
    # jobs cut at `silent_after_s` after their last event (0: no bound); added after the
    # first rows, hence the defaults
    silent_jobs: int = 0
    silent_after_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        return out

    @property
    def nothing_finished(self) -> bool:
        """No job of the day had finished when it was computed: every one still ran, or
        there was none yet in a day not over. Its figures are those of jobs in flight, so
        the fleet page headlines the last day before it that has finished work."""
        if self.fleet.jobs == 0:
            return self.computed_at < self.hi
        return self.fleet.provisional_jobs == self.fleet.jobs

    def silent_note(self) -> str | None:
        """What every report and page says of the day's silent jobs, if it has any."""
        if not self.silent_jobs:
            return None
        bound = f"{self.silent_after_s / 3600:.4g} h"
        return (f"{self.silent_jobs} job(s) not ended and silent for over {bound} (abandoned?):"
                f" counted only up to {bound} after their last event "
                "([ett] rollup_silent_after_s)")


def _slo(fleet: GroupFigures, components: ComponentsConfig) -> list[SloRow]:
    rows = []
    for c in COMPONENTS:
        policy = components.policies[c]
        share = fleet.shares_pct[c]
        rows.append(SloRow(component=c, owner=policy.owner, target=policy.target,
                           max_share_pct=policy.max_share_pct,
                           min_share_pct=policy.min_share_pct, share_pct=share,
                           gpu_hours_lost=fleet.gpu_hours_lost_by_component.get(c, 0.0),
                           status="none" if share is None else policy.status(share)))
    return rows


def _owned_share(rows: Iterable[SloRow]) -> float | None:
    shares = [row.share_pct for row in rows]
    return None if None in shares else sum(s for s in shares if s is not None)


def _teams(slo: list[SloRow], components: ComponentsConfig) -> list[TeamFigures]:
    by_component = {row.component: row for row in slo}
    teams = [
        TeamFigures(team=team, components=list(owned),
                    share_pct=_owned_share(by_component[c] for c in owned),
                    gpu_hours_lost=sum(by_component[c].gpu_hours_lost for c in owned),
                    breaches=[c for c in owned if by_component[c].status == "breach"])
        for team, owned in components.teams().items()
    ]
    return sorted(teams, key=lambda t: (-t.gpu_hours_lost, t.team))


def _merged(parts: Iterable[DayPart], cut_pct: float, start_s: float
            ) -> tuple[Totals, Savings, dict[str, Totals], dict[str, Totals]]:
    """The parts added up: for all of them, and by tenant and by model (fresh sums: the
    parts are left as they were)."""
    fleet, savings = Totals(), Savings(cut_pct=cut_pct, start_s=start_s)
    tenants: dict[str, Totals] = {}
    models: dict[str, Totals] = {}
    for part in parts:
        fleet.merge(part.totals)
        savings.merge(part.savings)
        tenants.setdefault(part.tenant, Totals()).merge(part.totals)
        models.setdefault(part.model or "-", Totals()).merge(part.totals)
    return fleet, savings, tenants, models


def rollup_of_parts(window: DayWindow, parts: Sequence[DayPart], components: ComponentsConfig,
                    *, computed_at: float, cut_pct: float = 50.0, start_s: float = 60.0,
                    top: int = TOP_RUNS, silent_after_s: float = 0.0) -> DayRollup:
    """The day's figures over these parts (all of a day's: the stored day; the readable
    ones: a restricted user's). The parts must have been made with the same what-if
    amounts (`whatif.Savings.merge` refuses others)."""
    totals, savings, tenants, models = _merged(parts, cut_pct, start_s)
    fleet = totals.figures()
    slo = _slo(fleet, components)
    return DayRollup(
        day=window.iso, tz=window.tz, lo=window.lo, hi=window.hi, computed_at=computed_at,
        provisional=totals.provisional_jobs > 0,
        synthetic_jobs=sum(p.synthetic_jobs for p in parts),
        fleet=fleet,
        tenants={name: tenants[name].figures() for name in sorted(tenants)},
        models={name: models[name].figures() for name in sorted(models)},
        teams=_teams(slo, components),
        slo=slo,
        what_if=savings.results(totals),
        top_runs=[w.run for w in worst_runs((w for p in parts for w in p.worst), top)],
        components_file=components.source,
        silent_jobs=sum(p.silent_jobs for p in parts),
        silent_after_s=silent_after_s,
    )


def rollup_day(window: DayWindow, job_days: Iterable[JobDay], components: ComponentsConfig, *,
               computed_at: float, cut_pct: float = 50.0, start_s: float = 60.0,
               top: int = TOP_RUNS, silent_after_s: float = 0.0) -> DayRollup:
    """The day's figures: the merge of all its parts (`parts.py`). Nothing in it depends
    on the order the store returned the jobs in."""
    parts = day_parts(job_days, cut_pct=cut_pct, start_s=start_s, top=top)
    return rollup_of_parts(window, parts, components, computed_at=computed_at,
                           cut_pct=cut_pct, start_s=start_s, top=top,
                           silent_after_s=silent_after_s)
