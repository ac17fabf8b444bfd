"""The figures behind the pages and the JSON API, read from the ETT store.

No FastAPI and no Airflow here (the routes bring those): functions of the store, the days
asked for and the DAGs the user may read, returning the API's models (`models.py`).

The fleet, two ways, same result for the same jobs:

- A user who may read every DAG gets the stored days (`ett_daily_days`, one row per day:
  what the nightly rollup computed), the cheap path.
- A user who may read only some DAGs gets each day as the merge of the stored parts of
  the DAGs they may read (`rollup.parts`: one row per DAG, tenant and model, sums that add
  up; `rollup_of_parts`, the computation the nightly run itself stored the day with), so
  the figures are those the nightly run would have stored for a fleet of just those jobs,
  at a cost in DAGs, not jobs (tests/plugin/web/test_data.py checks that with every DAG
  readable the merged days equal the stored ones). A day stored before parts were is
  made again from the readable DAGs' job rows (`ett_daily_jobs`, filtered in SQL on its
  `(day, dag_id)` index, so the other DAGs' rows are never read). A job with no DAG (sent
  by the CLI) or of a DAG Airflow does not know is readable only by the first kind of user.
  The what-if amounts and the components file are the stored day's own.

A run: the job id of a DAG run is `job_id_for(dag_id, run_id)` (a job named otherwise, a
simulated one say, is asked for with its id: `?job=`); its events are attributed now (a
job still running is provisional, its rolling windows, `[ett] rolling_windows`, cut out of
that one attribution by `last_windows`), through `store.follow`, which keeps each job's
events and attribution between requests and reads and attributes only what came since
(decision 0034: a day-long job's page in milliseconds, not half a second). The access
check is on the DAG in the path, so the job's own recorded DAG and run must be the ones
asked for, or it is not found:
`a__b` + `c` and `a` + `b__c` name the same job id, and a user allowed to read DAG `a`
must not read a run of DAG `a__b` through that, nor any job through `?job=`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import msgspec

from airflow_ett.ett.events import ModelPublished
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.jobs import job_id_for
from airflow_ett.plugin.web import models
from airflow_ett.rollup import (
    ComponentsConfig,
    ComponentsError,
    DayPart,
    DayRollup,
    DayWindow,
    JobDay,
    day_parts,
    load_components,
    rollup_of_parts,
)

if TYPE_CHECKING:
    from airflow_ett.ett.attribution import JobAttribution
    from airflow_ett.store import EttStore
    from airflow_ett.store.follow import Followed

log = logging.getLogger(__name__)

#: Days shown when the request names none: the two weeks ending today.
DEFAULT_DAYS: Final = 14
#: The most days one request may ask for (a quarter): every shown day is read.
MAX_DAYS: Final = 92


@dataclass(frozen=True, slots=True)
class DagScope:
    """The DAGs a user may read: all of them, or exactly `dag_ids`."""

    all_dags: bool
    dag_ids: frozenset[str] = frozenset()

    def allows(self, dag_id: str | None) -> bool:
        return self.all_dags or (dag_id is not None and dag_id in self.dag_ids)

    def model(self) -> models.Scope:
        return models.Scope(all_dags=self.all_dags,
                            readable_dags=None if self.all_dags else len(self.dag_ids))


class DaysError(ValueError):
    """Days asked for that name no range (the message names the parameter)."""


def days_asked(first: dt.date | None, last: dt.date | None, today: dt.date
               ) -> tuple[dt.date, dt.date]:
    """`[first, last]`: both given, or one and `DEFAULT_DAYS` around it, or the
    `DEFAULT_DAYS` ending today; at most `MAX_DAYS`."""
    span = dt.timedelta(days=DEFAULT_DAYS - 1)
    if first is None and last is None:
        last = today
    if first is None:
        assert last is not None
        first = last - span
    if last is None:
        last = first + span
    if last < first:
        raise DaysError(f"to: {last.isoformat()} is before from: {first.isoformat()}")
    if (last - first).days + 1 > MAX_DAYS:
        raise DaysError(f"from/to: {(last - first).days + 1} days; at most {MAX_DAYS} "
                        "days at once")
    return first, last


# -- the fleet ------------------------------------------------------------------------------

def job_day_of_row(row: Mapping[str, Any]) -> JobDay:
    """A stored `ett_daily_jobs` row (`DailyRollups.job_rows`) as the job-day it was made
    from (the store's own inverse of what it stored: `airflow_ett.store.daily`)."""
    from airflow_ett.store.daily import job_day_of_row as of_row

    return of_row(row)


def _what_if_amounts(day: DayRollup) -> tuple[float, float]:
    """The what-if parameters the stored day was computed with (its own rows say them)."""
    cut = next((w.amount for w in day.what_if if w.kind == "cut"), 50.0)
    start = next((w.amount for w in day.what_if if w.kind == "faster_start"), 60.0)
    return cut, start


def _components_of(day: DayRollup, fallback: ComponentsConfig | None) -> ComponentsConfig:
    """The owners and SLOs the stored day used: its components file, when it still loads."""
    try:
        if Path(day.components_file).is_file():
            return load_components(day.components_file)
    except ComponentsError as exc:
        log.warning("ETT pages: %s; using the configured components file", exc)
    if fallback is not None:
        return fallback
    from airflow_ett.settings import RollupSettings

    return load_components(RollupSettings.load().components_file)


class _Recent:
    """The last `size` restricted days computed, by (store, day, computed_at, DAGs): a
    day's rows change only when the rollup rewrites it (a new `computed_at`). Merging a
    day's parts is cheap (bench/pages.py: a new user's first look at two weeks, 56 ms p95
    in all), but a day stored without parts is re-rolled from its job rows (the same look
    took 269-353 ms p95 that way, about 12-16 us a readable job-day), so a user's second
    look at the same days reads nothing."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str, float, frozenset[str]], DayRollup] = (
            OrderedDict())
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, float, frozenset[str]]) -> DayRollup | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str, float, frozenset[str]], value: DayRollup) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_recent = _Recent(512)


def readable_day(store: EttStore, day: DayRollup, scope: DagScope,
                 components: ComponentsConfig | None = None) -> DayRollup:
    """The stored day recomputed over the jobs `scope` allows (see the module docstring)."""
    key = (store.url, day.day, day.computed_at, scope.dag_ids)
    cached = _recent.get(key)
    if cached is not None:
        return cached
    dags = store.daily.dag_ids_of_day(day.day)
    if None not in dags and dags <= scope.dag_ids:
        # Every job of the day is readable: the recomputation would give the stored day
        # back (tested), so skip it. A user denied only DAGs that send no ETT events
        # (maintenance DAGs, say) sees the stored fleet at the stored fleet's cost.
        result = day
    else:
        result = _recompute(store, day, scope, components)
    _recent.put(key, result)
    return result


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (reference counting still frees
    everything); as it was after it.

    Why: re-rolling a day stored without parts (below) makes ~5 tracked objects per job
    row that live until its rollup is done, so the collector's young generations promote
    them all (nothing in them is garbage yet) and every ~150,000 promotions Python runs a
    full collection of the whole API server heap: ~700,000 objects, 400 ms on this
    project's 2-core VM (bench/pages.py), inside one user's request. Paused, the day's
    objects are freed by reference counting before the collector next runs, and never
    promoted. The pause is process-wide but short; a concurrent request only runs without
    collection meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _readable_parts(store: EttStore, day: DayRollup, scope: DagScope,
                    cut_pct: float, start_s: float) -> list[DayPart]:
    """The day's parts of the DAGs `scope` allows: as stored by the nightly rollup, or,
    for a day stored before parts were, made again from the readable DAGs' job rows
    (`dag_id IN ...` on the table's (day, dag_id) index, so the other DAGs' rows never
    leave the database). `allows` stays the rule itself either way."""
    stored = store.daily.parts(day.day)
    if stored or day.fleet.jobs == 0:
        return [p for p in stored if scope.allows(p.dag_id)]
    with _collector_paused():
        readable = [d for d in store.daily.job_days(day.day, dag_ids=scope.dag_ids)
                    if scope.allows(d.dag_id)]
        return day_parts(readable, cut_pct=cut_pct, start_s=start_s)


def _recompute(store: EttStore, day: DayRollup, scope: DagScope,
               components: ComponentsConfig | None) -> DayRollup:
    window = DayWindow(day=dt.date.fromisoformat(day.day), tz=day.tz, lo=day.lo, hi=day.hi)
    cut_pct, start_s = _what_if_amounts(day)
    parts = _readable_parts(store, day, scope, cut_pct, start_s)
    return rollup_of_parts(window, parts, _components_of(day, components),
                           computed_at=day.computed_at, cut_pct=cut_pct, start_s=start_s)


def fleet_days(store: EttStore, first: dt.date, last: dt.date, scope: DagScope,
               components: ComponentsConfig | None = None) -> list[DayRollup]:
    """The days in `[first, last]` that have a rollup, oldest first, over `scope`."""
    stored = store.daily.days(first.isoformat(), last.isoformat())
    if scope.all_dags:
        return stored
    return [readable_day(store, d, scope, components) for d in stored]


def run_href(dag_id: str | None, run_id: str | None, job: str | None = None) -> str | None:
    """The run page, relative to the fleet page (`/ett/`), path parts quoted; with the job
    id when it is not the one the DAG run's ids make."""
    if not dag_id or not run_id:
        return None
    href = f"runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"
    if job is not None and job != job_id_for(dag_id, run_id):
        href += f"?job={quote(job, safe='')}"
    return href


def _point(day: DayRollup) -> models.DayPoint:
    f = day.fleet
    return models.DayPoint(day=day.day, jobs=f.jobs, ett_pct=f.ett_pct,
                           gpu_hours=f.gpu_hours, gpu_hours_lost=f.gpu_hours_lost,
                           gpu_hours_lost_to_slow_steps=f.gpu_hours_lost_to_slow_steps,
                           provisional=day.provisional, synthetic_jobs=day.synthetic_jobs,
                           computed_at=day.computed_at)


def _builtins(value: object) -> Any:
    return msgspec.to_builtins(value)


def _detail(day: DayRollup, previous: DayRollup | None) -> models.Day:
    change = None
    before = previous.fleet.ett_pct if previous is not None else None
    if before is not None and day.fleet.ett_pct is not None:
        change = day.fleet.ett_pct - before
    return models.Day(
        day=day.day, tz=day.tz, lo=day.lo, hi=day.hi, computed_at=day.computed_at,
        provisional=day.provisional, synthetic_jobs=day.synthetic_jobs,
        components_file=day.components_file,
        previous_day=previous.day if previous is not None else None, ett_pct_change=change,
        fleet=models.Group(**_builtins(day.fleet)),
        slo=[models.Slo(**_builtins(s)) for s in day.slo],
        teams=[models.Team(**_builtins(t)) for t in day.teams],
        tenants={k: models.Group(**_builtins(g)) for k, g in day.tenants.items()},
        models={k: models.Group(**_builtins(g)) for k, g in day.models.items()},
        what_if=[models.WhatIf(**_builtins(w), label=w.label)
                 for w in sorted(day.what_if, key=lambda w: -w.gain_pts)],
        top_runs=[models.RunLoss(**_builtins(r), href=run_href(r.dag_id, r.run_id, r.job))
                  for r in day.top_runs],
        silent_jobs=day.silent_jobs, silent_after_s=day.silent_after_s,
    )


def headline_index(days: Sequence[DayRollup]) -> int:
    """Which of `days` (oldest first) the page headlines: the newest, unless nothing in
    it had finished when it was computed (`DayRollup.nothing_finished`: a day whose jobs
    all still run, say just after midnight), then the newest day before it that has
    finished work; the newest when none has."""
    for i in range(len(days) - 1, -1, -1):
        if not days[i].nothing_finished:
            return i
    return len(days) - 1


def _notes(days: Sequence[DayRollup], first: dt.date, last: dt.date,
           scope: DagScope, newest: str | None = None) -> list[str]:
    if not days:
        where = (f" The newest stored day is {newest}." if newest is not None
                 else " The store holds no rollup yet.")
        return [f"No rollup is stored for {first.isoformat()} to {last.isoformat()}: the "
                "nightly DAG ett_fleet_rollup writes them (or run `airflow-ett rollup`)."
                + where]
    notes = []
    latest = days[headline_index(days)]
    for later in (d for d in days if d.day > latest.day):
        state = (f"all its {later.fleet.jobs} job(s) were still running" if later.fleet.jobs
                 else "it had no job yet")
        notes.append(f"{later.day} is provisional: {state} when it was computed; the "
                     f"headline is {latest.day}, the newest day with finished work.")
    if latest.provisional:
        notes.append(f"{latest.day} is provisional: {latest.fleet.provisional_jobs} of its "
                     f"{latest.fleet.jobs} jobs were still running when it was computed.")
    if any(d.synthetic_jobs for d in days):
        notes.append("Some jobs shown are synthetic (airflow-ett fleet simulate), not "
                     "measured.")
    silent = latest.silent_note()
    if silent is not None:
        notes.append(f"{latest.day}: {silent}.")
    if not scope.all_dags:
        notes.append(f"Computed over the {len(scope.dag_ids)} DAG(s) you may read, not the "
                     "whole fleet.")
    return notes


def tenants_note() -> str | None:
    """What the fleet page says of a tenants file that cannot be used as it is now: the
    scheduling plugin keeps its last good version (or none) in force meanwhile."""
    from airflow_ett.scheduling import tenants

    try:
        path = tenants.tenants_file_from_settings()
        if path is None:
            return None
        state = tenants.current(path)
    except Exception as exc:  # the page must show what it can
        return f"The tenants file cannot be read: {exc}."
    if state.error is None:
        return None
    if state.config is None:
        return f"No tenant policy is in force: {state.error}."
    loaded = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(state.loaded_at or 0))
    return (f"The tenants file is broken, so the version loaded at {loaded} stays in force: "
            f"{state.error}.")


def fleet(store: EttStore, first: dt.date, last: dt.date, scope: DagScope, *,
          figures: bool = False) -> models.Fleet:
    days = fleet_days(store, first, last, scope)
    at = headline_index(days)
    latest = days[at] if days else None
    previous = days[at - 1] if at > 0 else None
    specs = None
    if figures and days:
        from airflow_ett.report.html import fleet_figures

        specs = fleet_figures(days)
    return models.Fleet(
        first=first.isoformat(), last=last.isoformat(), scope=scope.model(),
        days=[_point(d) for d in days],
        latest=_detail(latest, previous) if latest is not None else None,
        notes=[*_notes(days, first, last, scope, None if days else store.daily.last_day()),
               *filter(None, [tenants_note()])],
        figures=specs)


# -- one run ---------------------------------------------------------------------------------

class RunUnreadable(ValueError):
    """The run's stored events do not describe one job (the message says why)."""


def _share(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def _published(events: Iterable[ModelPublished]) -> list[models.Published]:
    return [models.Published(ts=e.ts, uri=e.uri) for e in events]


def _configured_windows() -> tuple[tuple[int, ...], list[str]]:
    """`[ett] rolling_windows`, or none and the one line that says what is wrong with it
    (the page shows the rest of the run either way)."""
    from airflow_ett.settings import RollingSettings, SettingsError

    try:
        return RollingSettings.load_windows(), []
    except SettingsError as exc:
        return (), [f"no rolling windows: {exc}"]


def _windows(a: JobAttribution, minutes: Sequence[int]) -> list[models.Window]:
    """A running job's last `minutes` each (none for a finished one: its figures are
    final, and a window of its last minutes would be mostly shutdown)."""
    if not a.provisional or not minutes:
        return []
    from airflow_ett.ett.attribution import last_windows

    return [models.Window(minutes=m, lo=w.lo, hi=w.hi, e2e_s=w.e2e_in_window_s,
                          ett_pct=w.ett_pct, components_s=w.components_s)
            for m, w in zip(minutes, last_windows(a, [60.0 * m for m in minutes]),
                            strict=True)]


def _timeline(a: JobAttribution) -> tuple[models.Timeline, Any]:
    from airflow_ett.report.timeline import run_timeline

    tl = run_timeline(a)
    return models.Timeline(rows=tl.rows, bars=[models.Bar(**_builtins(b)) for b in tl.bars],
                           failures=[models.FailureMark(**_builtins(f))
                                     for f in tl.failures]), tl


def attribute_run(store: EttStore, dag_id: str, run_id: str, *, now: float,
                  job: str | None = None) -> tuple[JobAttribution, Followed] | None:
    """The run's attribution and what the page reads of its events, or None when the
    store has none for it. Read through `store.follow`: the job's events kept from the
    last request, only what came since read and attributed (decision 0034), the figures
    those of `attribute_job` over all of them."""
    from airflow_ett.ett.attribution import AttributionError

    try:
        found = store.follow.attribution(job or job_id_for(dag_id, run_id), now=now)
    except AttributionError as exc:
        raise RunUnreadable(f"the stored events of {dag_id} / {run_id} cannot be "
                            f"attributed: {exc}") from None
    if found is None:
        return None
    attribution = found.attribution
    if (attribution.dag_id, attribution.run_id) != (dag_id, run_id):
        return None  # another DAG's run with the same job id (see the module docstring)
    return attribution, found


def _silence(a: JobAttribution, last_ts: float, now: float,
             silent_after_s: float | None) -> list[str]:
    """A warning for a job not ended that has been silent longer than the rollup's bound
    (`last_ts`: its latest event): the page shows it running up to now, the rollup no
    longer counts it (decision 0010)."""
    if not a.provisional:
        return []
    if silent_after_s is None:
        from airflow_ett.settings import RollupSettings

        silent_after_s = RollupSettings.load().silent_after_s
    quiet = now - last_ts
    if silent_after_s <= 0 or quiet <= silent_after_s:
        return []
    return [f"no event for {quiet / 3600:.1f} h: the job may be abandoned (its worker gone "
            f"unseen); the nightly rollup counts it only up to {silent_after_s / 3600:.4g} h "
            "after its last event ([ett] rollup_silent_after_s)"]


def run(store: EttStore, dag_id: str, run_id: str, *, now: float, figures: bool = False,
        job: str | None = None, silent_after_s: float | None = None,
        windows_min: Sequence[int] | None = None) -> models.Run | None:
    """The run's page; `silent_after_s` is `[ett] rollup_silent_after_s` when None,
    `windows_min` (minutes) `[ett] rolling_windows`.

    The cyclic collector waits meanwhile: a long job's events are tens of thousands of
    objects alive until the answer is made, which the collector would promote into full
    collections of the API server's heap (`_collector_paused`); a running job's page asks
    again every 10 s."""
    with _collector_paused():
        return _run(store, dag_id, run_id, now=now, figures=figures, job=job,
                    silent_after_s=silent_after_s, windows_min=windows_min)


def _run(store: EttStore, dag_id: str, run_id: str, *, now: float, figures: bool,
         job: str | None, silent_after_s: float | None,
         windows_min: Sequence[int] | None) -> models.Run | None:
    found = attribute_run(store, dag_id, run_id, now=now, job=job)
    if found is None:
        return None
    a, read = found
    window_notes: list[str] = []
    if windows_min is None and a.provisional:
        windows_min, window_notes = _configured_windows()
    s = a.summary()
    timeline, raw_timeline = _timeline(a)
    specs = None
    if figures:
        from airflow_ett.report.html import timeline_figure

        specs = {"timeline": timeline_figure(raw_timeline)}
    phases = sorted(s.phases.items(), key=lambda kv: (-kv[1], kv[0]))
    return models.Run(
        job=s.job, dag_id=dag_id, run_id=run_id, tenant=s.tenant, model=s.model,
        provisional=s.provisional, synthetic=s.synthetic, world_size=s.world_size,
        submitted_at=s.submitted_at, ended_at=s.ended_at, now=now, ett_pct=s.ett_pct,
        e2e_s=s.e2e_s, effective_s=s.effective_s, windows=_windows(a, windows_min or ()),
        level1=models.Level1(
            tts_s=s.tts_s, started=s.started, ttr_s=s.ttr_s, nof=s.nof,
            attempts=len(s.attempts), failures_per_attempt=s.rates.failures_per_attempt,
            failures_per_attempt_without_preemption=(
                s.rates.failures_per_attempt_without_preemption),
            csbt_s=s.csbt_s, checkpoint_saves=s.checkpoints.saves, shutdown_s=s.shutdown_s,
            in_loop_waste_s=s.in_loop_waste_s,
            model_available_after_release_s=s.model_available_after_release_s),
        level2=[models.Component(component=c, seconds=s.components[c],
                                 share_pct=_share(s.components[c], s.e2e_s))
                for c in COMPONENTS],
        phases=[models.Phase(phase=p, component=s.phase_components.get(p, "?"), seconds=v,
                             share_pct=_share(v, s.e2e_s)) for p, v in phases],
        attempts=[models.Attempt(**_builtins(x)) for x in s.attempts],
        failures=[models.Failure(attempt=f.attempt, cause=f.cause, at=f.at,
                                 during_tts=f.during_tts, ttr_s=f.ttr_s,
                                 detection_s=f.detection_s,
                                 ttr_from_detection_s=f.ttr_from_detection_s)
                  for f in s.failures],
        published=_published(read.published), timeline=timeline,
        warnings=[*s.warnings, *_silence(a, read.last_ts, now, silent_after_s),
                  *window_notes],
        slow_steps=None if s.slow_steps is None else models.SlowSteps(
            ideal_step_s=s.slow_steps.ideal_step_s, lost_s=s.slow_steps.lost_s,
            lost_pct_of_effective=s.slow_steps.lost_pct_of_effective,
            spans=s.slow_steps.spans, slow_spans=s.slow_steps.slow_spans),
        rank_steps=None if s.rank_steps is None else models.RankSteps(
            ranks=[models.RankStepTime(rank=r.rank, step_s=r.step_s,
                                       wait_step_s=r.wait_step_s, steps=r.steps)
                   for r in s.rank_steps.ranks],
            stragglers=[models.Straggler(**_builtins(x)) for x in s.rank_steps.stragglers]),
        flags=[models.Flag(kind=f.kind, at=f.at, message=f.message, bound_s=f.bound_s,
                           waited_s=f.waited_s) for f in store.flags.of_job(s.job)],
        figures=specs)


__all__ = ["DEFAULT_DAYS", "MAX_DAYS", "DagScope", "DaysError", "RunUnreadable",
           "attribute_run", "days_asked", "fleet", "fleet_days", "headline_index",
           "job_day_of_row",
           "readable_day", "run", "run_href"]
