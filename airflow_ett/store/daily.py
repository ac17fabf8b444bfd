"""The nightly rollup's rows: which jobs a day needs, computing days, keeping and reading them.

A day reads only the jobs whose wall time can touch it: submitted before the day ends and
not ended before it starts (a job still running counts up to `now`, provisional). Their
events are read in chunks of job ids, attributed once per day, cut at the day's bounds
(`rollup.job_day`) and rolled up; the day's rows then replace the old ones in one
transaction, so a rerun, or a rerun racing another, never leaves a day half old.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_ett.ett.events import Event, EventError, decode_stored
from airflow_ett.rollup.figures import US_PER_H, US_PER_S
from airflow_ett.store.schema import daily_days, daily_groups, daily_jobs, events, jobs

if TYPE_CHECKING:
    from airflow_ett.ett.attribution import JobAttribution
    from airflow_ett.rollup import ComponentsConfig, DayRollup, DayWindow, JobDay
    from airflow_ett.store.store import EttStore

log = logging.getLogger(__name__)

_JOB_CHUNK: Final = 400  # job ids per IN (...) read
_ROW_CHUNK: Final = 2000  # rows per INSERT batch


def _json(value: object) -> str:
    return json.dumps(msgspec.to_builtins(value), separators=(",", ":"))


def _job_row(day: str, d: JobDay) -> dict[str, Any]:
    payload = {
        "components_s": {c: us / US_PER_S for c, us in d.components_us.items()},
        "tts_s": None if d.tts_us is None else d.tts_us / US_PER_S,
        "failures": [{"cause": f.cause,
                      "ttr_s": None if f.ttr_us is None else f.ttr_us / US_PER_S}
                     for f in d.failures],
        "attempts": d.attempts,
        "preempted_attempts": d.preempted_attempts,
    }
    return {"day": day, "job": d.job, "tenant": d.tenant, "model": d.model,
            "dag_id": d.dag_id, "run_id": d.run_id, "gpus": d.gpus,
            "provisional": d.provisional, "synthetic": d.synthetic,
            "e2e_s": d.e2e_us / US_PER_S, "effective_s": d.effective_us / US_PER_S,
            "gpu_hours": d.gpu_us / US_PER_H, "gpu_hours_lost": d.lost_gpu_us / US_PER_H,
            "payload": json.dumps(payload, separators=(",", ":"))}


def _group_rows(r: DayRollup) -> list[dict[str, Any]]:
    rows = []
    for scope, groups in (("tenant", r.tenants), ("model", r.models)):
        for key, g in groups.items():
            rows.append({"day": r.day, "scope": scope, "key": key, "jobs": g.jobs,
                         "ett_pct": g.ett_pct, "gpu_hours": g.gpu_hours,
                         "gpu_hours_lost": g.gpu_hours_lost, "payload": _json(g)})
    for team in r.teams:
        rows.append({"day": r.day, "scope": "team", "key": team.team, "jobs": r.fleet.jobs,
                     "ett_pct": None, "gpu_hours": None,
                     "gpu_hours_lost": team.gpu_hours_lost, "payload": _json(team)})
    return rows


class DailyRollups:
    """The `ett_daily_*` rows of one store (`EttStore.daily`)."""

    def __init__(self, store: EttStore) -> None:
        self._store = store

    # -- reading what a day needs --------------------------------------------------

    def jobs_touching(self, lo: float, hi: float) -> list[str]:
        """Jobs whose `[submitted, ended)` can overlap `[lo, hi)`, by id. A job whose
        submission has not arrived is placed by its events (its first is at most its
        last)."""
        started_before = sa.or_(jobs.c.submitted_ts < hi,
                                sa.and_(jobs.c.submitted_ts.is_(None),
                                        jobs.c.last_event_ts >= lo))
        not_over = sa.or_(jobs.c.ended_ts.is_(None), jobs.c.ended_ts >= lo)
        query = sa.select(jobs.c.job).where(started_before, not_over).order_by(jobs.c.job)
        return list(self._store._read(lambda conn: conn.scalars(query).all()))

    def _events_by_job(self, conn: Connection, ids: Sequence[str]) -> dict[str, list[Event]]:
        rows = conn.execute(
            sa.select(events.c.job, events.c.id, events.c.payload)
            .where(events.c.job.in_(ids)).order_by(events.c.job, events.c.ts, events.c.seq)
        ).all()
        out: dict[str, list[Event]] = {job: [] for job in ids}
        for job, event_id, payload in rows:
            try:
                out[job].append(decode_stored(payload))
            except EventError as exc:  # stored before a rule tightened: skip, say so
                log.warning("ETT store %s: job %r: stored event %r left out of the rollup: "
                            "%s", self._store.url, job, event_id, exc)
        return out

    def attributions(self, lo: float, hi: float, *, now: float) -> Iterator[JobAttribution]:
        """The attribution of every job touching `[lo, hi)`, a chunk of jobs at a time."""
        from airflow_ett.ett.attribution import AttributionError, attribute_job

        ids = self.jobs_touching(lo, hi)
        for start in range(0, len(ids), _JOB_CHUNK):
            chunk = ids[start:start + _JOB_CHUNK]
            by_job = self._store._read(partial(self._events_by_job, ids=chunk))
            for job in chunk:
                try:
                    yield attribute_job(by_job[job], now=now)
                except AttributionError as exc:
                    log.warning("ETT store %s: job %r left out of the rollup: %s",
                                self._store.url, job, exc)

    # -- computing and keeping days ------------------------------------------------

    def compute_day(self, window: DayWindow, components: ComponentsConfig, *, now: float,
                    cut_pct: float = 50.0, start_s: float = 60.0) -> DayRollup:
        """Roll the day up from the store's events and replace its rows."""
        from airflow_ett.rollup import job_day, rollup_day

        parts = [job_day(a, window, gpus=a.world_size, synthetic=a.synthetic)
                 for a in self.attributions(window.lo, window.hi, now=now)]
        days = [p for p in parts if p is not None]
        rollup = rollup_day(window, days, components, computed_at=now, cut_pct=cut_pct,
                            start_s=start_s)
        self.replace(rollup, days)
        return rollup

    def compute(self, windows: Iterable[DayWindow], components: ComponentsConfig, *,
                now: float, cut_pct: float = 50.0, start_s: float = 60.0,
                advance: Callable[[int], None] | None = None) -> list[DayRollup]:
        out = []
        for window in windows:
            out.append(self.compute_day(window, components, now=now, cut_pct=cut_pct,
                                        start_s=start_s))
            if advance is not None:
                advance(1)
        return out

    def replace(self, rollup: DayRollup, job_days: Sequence[JobDay]) -> None:
        """The day's rows become these, in one transaction."""
        day = rollup.day
        fleet = rollup.fleet
        day_row = {"day": day, "tz": rollup.tz, "lo": rollup.lo, "hi": rollup.hi,
                   "computed_at": rollup.computed_at, "provisional": rollup.provisional,
                   "jobs": fleet.jobs, "ett_pct": fleet.ett_pct, "gpu_hours": fleet.gpu_hours,
                   "gpu_hours_lost": fleet.gpu_hours_lost, "payload": _json(rollup)}
        group_rows = _group_rows(rollup)
        job_rows = [_job_row(day, d) for d in job_days]

        def write(conn: Connection) -> None:
            for table in (daily_jobs, daily_groups, daily_days):
                conn.execute(sa.delete(table).where(table.c.day == day))
            conn.execute(sa.insert(daily_days), [day_row])
            if group_rows:
                conn.execute(sa.insert(daily_groups), group_rows)
            for start in range(0, len(job_rows), _ROW_CHUNK):
                conn.execute(sa.insert(daily_jobs), job_rows[start:start + _ROW_CHUNK])

        self._store._write(write)

    # -- reading days back ---------------------------------------------------------

    def day(self, day: str) -> DayRollup | None:
        from airflow_ett.rollup import DayRollup

        payload = self._store._read(lambda conn: conn.scalar(
            sa.select(daily_days.c.payload).where(daily_days.c.day == day)))
        return None if payload is None else msgspec.json.decode(payload, type=DayRollup)

    def days(self, first: str | None = None, last: str | None = None) -> list[DayRollup]:
        """The stored days in `[first, last]` (ISO dates, both included), oldest first."""
        from airflow_ett.rollup import DayRollup

        query = sa.select(daily_days.c.payload).order_by(daily_days.c.day)
        if first is not None:
            query = query.where(daily_days.c.day >= first)
        if last is not None:
            query = query.where(daily_days.c.day <= last)
        payloads = self._store._read(lambda conn: conn.scalars(query).all())
        return [msgspec.json.decode(p, type=DayRollup) for p in payloads]

    def job_rows(self, day: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The day's job rows, the most GPU-hours lost first."""
        query = (sa.select(daily_jobs).where(daily_jobs.c.day == day)
                 .order_by(daily_jobs.c.gpu_hours_lost.desc(), daily_jobs.c.job))
        if limit is not None:
            query = query.limit(limit)
        rows = self._store._read(lambda conn: conn.execute(query).all())
        return [{**row._mapping, "payload": json.loads(row.payload)} for row in rows]

    def group_rows(self, day: str, scope: str) -> list[dict[str, Any]]:
        query = (sa.select(daily_groups)
                 .where(daily_groups.c.day == day, daily_groups.c.scope == scope)
                 .order_by(daily_groups.c.key))
        rows = self._store._read(lambda conn: conn.execute(query).all())
        return [{**row._mapping, "payload": json.loads(row.payload)} for row in rows]
