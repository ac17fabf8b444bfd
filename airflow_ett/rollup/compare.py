"""What moved fleet ETT% between two windows of stored days (`airflow-ett report --compare`).

Two ways, both from the windows' stored parts (`parts.DayPart`, sums that add up, read as
`PartSums`: only the sums used here):

- **the fleet as operated**: every job of each window. Its change mixes what got better
  or worse with who ran: a model that entered or left, or grew, moves the fleet figure
  without any job getting better (the source work's fleet trend was this one);
- **a fixed cohort**: only the models that ran (had GPU time) in both windows, so the
  change is that of the same models.

Each way splits the ETT% change exactly three times (docs/decisions/0031-regression-compare.md):
by Level-2 component (ETT% is 100 minus the five lost shares, so a lost share that fell
by `x` points raised ETT% by `x`: the five add up to the change), by tenant and by model
(`shift_share.contributions`: a group's own ETT% moving, `rate`, plus its weight in the
fleet's GPU time moving, `mix`; they add up to the change). Each list is ranked by size.
The models that entered, left or changed platform are listed apart; "platform" is the
GPU counts (world sizes) a model's jobs ran with, the one fact of how a job ran that its
events record (`DayPart.gpu_counts`).

Pure: parts in, a `Comparison` out; no Airflow, no SQL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from airflow_ett.rollup.calendar import CalendarError, parse_day
from airflow_ett.rollup.figures import LOST_COMPONENTS, US_PER_H
from airflow_ett.rollup.parts import DayPart
from airflow_ett.rollup.shift_share import Amounts, Contribution, contributions

ModelChangeKind = Literal["entered", "left", "platform"]
#: The most days one window may hold (a year: every day's parts are read).
MAX_WINDOW_DAYS: Final = 366


class WindowError(ValueError):
    """A window that names no days to compare; the message names the value (its caller
    puts the field before it: `--compare`, `a`)."""


class Span(msgspec.Struct, frozen=True, kw_only=True):
    """A window of stored days: `first` to `last` (ISO dates, both included)."""

    first: str
    last: str
    days: int  # days in it (a comparison needs every one stored)

    @property
    def label(self) -> str:
        return f"{self.first}..{self.last}"


class Side(msgspec.Struct, frozen=True, kw_only=True):
    """One window's totals in a view."""

    ett_pct: float | None  # GPU-weighted; None: no GPU time
    job_days: int  # a job counts once in each day it ran in
    provisional_job_days: int  # of a job still running when its day was stored
    synthetic_job_days: int  # of simulated jobs (`airflow-ett fleet simulate`)
    gpu_hours: float
    gpu_hours_lost: float
    tenants: int  # with GPU time
    models: int


class ComponentMove(msgspec.Struct, frozen=True, kw_only=True):
    """A lost component's share of the GPU time in each window, and what its move did to
    ETT%: `ett_points = before_pct - after_pct` (a share that fell raised ETT%)."""

    component: str
    before_pct: float | None
    after_pct: float | None
    ett_points: float | None  # None: a window has no GPU time


class GroupMove(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's or model's contribution to the ETT% change, `points = rate_points +
    mix_points` (`shift_share`), with its own ETT% and GPU-hours in each window."""

    name: str
    points: float
    rate_points: float  # its own ETT% moved (weighed by its share of the later window)
    mix_points: float  # its share of the GPU time moved (by its distance from the fleet)
    before_pct: float | None  # None: no GPU time in the earlier window (it entered)
    after_pct: float | None  # None: none in the later one (it left)
    gpu_hours_before: float
    gpu_hours_after: float


class View(msgspec.Struct, frozen=True, kw_only=True):
    """One way of looking at the change (the fleet as operated, or the cohort). Each of
    `components`, `tenants` and `models` adds up to `change_points`, largest first."""

    before: Side
    after: Side
    change_points: float | None  # None: a window has no GPU time (no split either)
    components: list[ComponentMove]
    tenants: list[GroupMove]
    models: list[GroupMove]


class ModelChange(msgspec.Struct, frozen=True, kw_only=True):
    """A model that entered, left or changed platform (the GPU counts its jobs ran with;
    None: some of its days were stored without them), and its contribution to the
    fleet's change as operated."""

    model: str
    change: ModelChangeKind
    tenants: list[str]
    gpus_before: list[int] | None
    gpus_after: list[int] | None
    gpu_hours_before: float
    gpu_hours_after: float
    before_pct: float | None
    after_pct: float | None
    points: float


class Churn(msgspec.Struct, frozen=True, kw_only=True):
    """The fleet's change as operated, split by the models' fate (the models split, summed
    by kind): `cohort_points + entered_points + left_points == change_points`."""

    cohort_points: float
    entered_points: float
    left_points: float


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    before: Span
    after: Span
    fleet: View  # as operated
    cohort: View  # the models with GPU time in both windows
    cohort_models: int
    churn: Churn | None  # None: a window has no GPU time
    entered: list[ModelChange]  # the most GPU-hours first
    left: list[ModelChange]
    platform_changed: list[ModelChange]
    platform_unknown: list[str]  # cohort models whose GPU counts a window did not store

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


class TotalsSums(msgspec.Struct, kw_only=True, gc=False):
    """The sums of a part's `figures.Totals` that a comparison reads."""

    jobs: int = 0
    provisional_jobs: int = 0
    gpu_us: int = 0
    lost_gpu_us: dict[str, int] = {}


class PartSums(msgspec.Struct, kw_only=True, gc=False):
    """The fields of a stored `DayPart` that a comparison reads. Decoded from a part's
    JSON (`DailyRollups.window_parts`), it skips the rest (every job's TTS and TTR, the
    worst runs, the what-if sums: 90% of the bytes), 6x faster than the whole part
    (bench/compare.py)."""

    dag_id: str | None
    tenant: str
    model: str
    synthetic_jobs: int = 0
    totals: TotalsSums
    gpu_counts: dict[int, int] = {}  # empty: stored before parts counted GPUs


def sums_of(part: DayPart) -> PartSums:
    """A part as the sums a comparison reads."""
    t = part.totals
    return PartSums(dag_id=part.dag_id, tenant=part.tenant, model=part.model,
                    synthetic_jobs=part.synthetic_jobs,
                    totals=TotalsSums(jobs=t.jobs, provisional_jobs=t.provisional_jobs,
                                      gpu_us=t.gpu_us, lost_gpu_us=dict(t.lost_gpu_us)),
                    gpu_counts=dict(part.gpu_counts))


@dataclass(frozen=True, slots=True)
class WindowParts:
    """A window and the parts of all its stored days (any order)."""

    span: Span
    parts: Sequence[PartSums]


def parse_window(text: str) -> tuple[dt.date, dt.date]:
    """`D1..D2` (days `YYYY-MM-DD`, both included; `D` alone is one day) as its first and
    last day: days events can fall in, first <= last, at most `MAX_WINDOW_DAYS`."""
    first_text, dots, last_text = text.partition("..")
    try:
        first = parse_day(first_text, field="day")
        last = parse_day(last_text if dots else first_text, field="day")
    except CalendarError as exc:
        raise WindowError(f"{text!r}: {str(exc).removeprefix('day: ')}; a window is D1..D2"
                          ) from None
    if last < first:
        raise WindowError(f"{text!r}: its first day {first} is after its last {last}")
    if (last - first).days + 1 > MAX_WINDOW_DAYS:
        raise WindowError(f"{text!r}: {(last - first).days + 1} days; at most "
                          f"{MAX_WINDOW_DAYS} in a window")
    return first, last


def window(first: dt.date, last: dt.date, parts_by_day: Mapping[str, Sequence[PartSums]]
           ) -> WindowParts:
    """The window `[first, last]` of these stored days' parts (`parts_by_day`: at least
    every stored day of the window, ISO date -> its parts). Every day must be stored: a
    missing one would silently shrink the window, so `WindowError` names the missing days
    and the rollup that fills them."""
    count = (last - first).days + 1
    days = [(first + dt.timedelta(days=i)).isoformat() for i in range(count)]
    missing = [d for d in days if d not in parts_by_day]
    if missing:
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more"
                                           if len(missing) > 3 else "")
        raise WindowError(f"{first}..{last}: {len(missing)} of its {count} days not rolled up "
                          f"({listed}): run `airflow-ett rollup --from {missing[0]} --to "
                          f"{missing[-1]}` first")
    return WindowParts(span=Span(first=first.isoformat(), last=last.isoformat(), days=count),
                       parts=[p for d in days for p in parts_by_day[d]])


@dataclass(slots=True)
class _Sums:
    """Integer sums of a group in one window (GPU-microseconds: exact)."""

    job_days: int = 0
    provisional: int = 0
    synthetic: int = 0
    gpu_us: int = 0
    lost: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOST_COMPONENTS, 0))
    gpus: set[int] = field(default_factory=set)
    gpus_known: bool = True

    def add_part(self, p: PartSums) -> None:
        t = p.totals
        self.job_days += t.jobs
        self.provisional += t.provisional_jobs
        self.synthetic += p.synthetic_jobs
        self.gpu_us += t.gpu_us
        for c in LOST_COMPONENTS:
            self.lost[c] += t.lost_gpu_us.get(c, 0)
        self.gpus.update(p.gpu_counts)
        if t.jobs and not p.gpu_counts:
            self.gpus_known = False  # stored before parts counted GPUs

    def add(self, other: _Sums) -> None:
        self.job_days += other.job_days
        self.provisional += other.provisional
        self.synthetic += other.synthetic
        self.gpu_us += other.gpu_us
        for c in LOST_COMPONENTS:
            self.lost[c] += other.lost[c]
        self.gpus |= other.gpus
        self.gpus_known = self.gpus_known and other.gpus_known

    @property
    def effective_gpu_us(self) -> int:
        return self.gpu_us - sum(self.lost.values())

    def amounts(self) -> Amounts:
        return Amounts(part=float(self.effective_gpu_us), whole=float(self.gpu_us))

    def ett_pct(self) -> float | None:
        return 100.0 * self.effective_gpu_us / self.gpu_us if self.gpu_us > 0 else None


_Key = tuple[str, str]  # (tenant, model)


def _by_tenant_model(parts: Iterable[PartSums]) -> dict[_Key, _Sums]:
    out: dict[_Key, _Sums] = {}
    for p in parts:
        key = (p.tenant, p.model or "-")  # "-": as DayRollup names a job of no model
        sums = out.get(key)
        if sums is None:
            sums = out[key] = _Sums()
        sums.add_part(p)
    return out


def _grouped(cells: Mapping[_Key, _Sums], at: int) -> dict[str, _Sums]:
    out: dict[str, _Sums] = {}
    for key, sums in cells.items():
        out.setdefault(key[at], _Sums()).add(sums)
    return out


def _total(cells: Mapping[_Key, _Sums]) -> _Sums:
    total = _Sums()
    for sums in cells.values():
        total.add(sums)
    return total


def _side(cells: Mapping[_Key, _Sums]) -> Side:
    total = _total(cells)
    ran = [key for key, s in cells.items() if s.gpu_us > 0]
    return Side(ett_pct=total.ett_pct(), job_days=total.job_days,
                provisional_job_days=total.provisional, synthetic_job_days=total.synthetic,
                gpu_hours=total.gpu_us / US_PER_H,
                gpu_hours_lost=sum(total.lost.values()) / US_PER_H,
                tenants=len({t for t, _ in ran}), models=len({m for _, m in ran}))


def _share(sums: _Sums, component: str) -> float | None:
    return 100.0 * sums.lost[component] / sums.gpu_us if sums.gpu_us > 0 else None


def _components(before: _Sums, after: _Sums) -> list[ComponentMove]:
    moves = []
    for c in LOST_COMPONENTS:
        b, a = _share(before, c), _share(after, c)
        moves.append(ComponentMove(component=c, before_pct=b, after_pct=a,
                                   ett_points=None if a is None or b is None else b - a))
    return sorted(moves, key=lambda m: (-abs(m.ett_points or 0.0), m.component))


def _moves(before: Mapping[str, _Sums], after: Mapping[str, _Sums]) -> list[GroupMove]:
    split: list[Contribution] = contributions({k: s.amounts() for k, s in before.items()},
                                              {k: s.amounts() for k, s in after.items()})
    empty = _Sums()
    return [GroupMove(name=c.group, points=c.points, rate_points=c.rate, mix_points=c.mix,
                      before_pct=c.before_pct, after_pct=c.after_pct,
                      gpu_hours_before=before.get(c.group, empty).gpu_us / US_PER_H,
                      gpu_hours_after=after.get(c.group, empty).gpu_us / US_PER_H)
            for c in split]


def _view(before: Mapping[_Key, _Sums], after: Mapping[_Key, _Sums]) -> View:
    b, a = _side(before), _side(after)
    change = None if a.ett_pct is None or b.ett_pct is None else a.ett_pct - b.ett_pct
    return View(before=b, after=a, change_points=change,
                components=_components(_total(before), _total(after)),
                tenants=_moves(_grouped(before, 0), _grouped(after, 0)),
                models=_moves(_grouped(before, 1), _grouped(after, 1)))


def _gpus(sums: _Sums | None) -> list[int] | None:
    if sums is None:
        return []
    return sorted(sums.gpus) if sums.gpus_known else None


def _model_change(model: str, kind: ModelChangeKind, before: Mapping[str, _Sums],
                  after: Mapping[str, _Sums], tenants: list[str], points: float
                  ) -> ModelChange:
    b, a = before.get(model), after.get(model)
    return ModelChange(model=model, change=kind, tenants=tenants, gpus_before=_gpus(b),
                       gpus_after=_gpus(a), gpu_hours_before=b.gpu_us / US_PER_H if b else 0.0,
                       gpu_hours_after=a.gpu_us / US_PER_H if a else 0.0,
                       before_pct=b.ett_pct() if b else None,
                       after_pct=a.ett_pct() if a else None, points=points)


def compare(before: WindowParts, after: WindowParts) -> Comparison:
    """The comparison of `after` against `before` (the earlier window first, by
    convention: the change is `after - before`)."""
    cells_b, cells_a = _by_tenant_model(before.parts), _by_tenant_model(after.parts)
    models_b, models_a = _grouped(cells_b, 1), _grouped(cells_a, 1)
    ran_b = {m for m, s in models_b.items() if s.gpu_us > 0}
    ran_a = {m for m, s in models_a.items() if s.gpu_us > 0}
    cohort = ran_b & ran_a
    fleet = _view(cells_b, cells_a)
    cohort_view = _view({k: s for k, s in cells_b.items() if k[1] in cohort},
                        {k: s for k, s in cells_a.items() if k[1] in cohort})
    points = {m.name: m.points for m in fleet.models}
    tenants: dict[str, set[str]] = {}
    for cells in (cells_b, cells_a):
        for (tenant, model), s in cells.items():
            if s.gpu_us > 0:
                tenants.setdefault(model, set()).add(tenant)

    def change(model: str, kind: ModelChangeKind) -> ModelChange:
        return _model_change(model, kind, models_b, models_a, sorted(tenants[model]),
                             points.get(model, 0.0))

    def biggest(changes: Iterable[ModelChange]) -> list[ModelChange]:
        return sorted(changes, key=lambda c: (-max(c.gpu_hours_before, c.gpu_hours_after),
                                              c.model))

    entered = biggest(change(m, "entered") for m in ran_a - ran_b)
    left = biggest(change(m, "left") for m in ran_b - ran_a)
    unknown = sorted(m for m in cohort
                     if not (models_b[m].gpus_known and models_a[m].gpus_known))
    moved = biggest(change(m, "platform") for m in cohort
                    if m not in unknown and models_b[m].gpus != models_a[m].gpus)
    churn = None
    if fleet.change_points is not None:
        churn = Churn(cohort_points=sum(p for m, p in points.items() if m in cohort),
                      entered_points=sum(c.points for c in entered),
                      left_points=sum(c.points for c in left))
    return Comparison(before=before.span, after=after.span, fleet=fleet, cohort=cohort_view,
                      cohort_models=len(cohort), churn=churn, entered=entered, left=left,
                      platform_changed=moved, platform_unknown=unknown)
