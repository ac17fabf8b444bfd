"""The nightly rollup's rows: which jobs a day needs, computing days, keeping and reading them.

A day reads only the jobs whose wall time can touch it: submitted before the day ends and
not ended before it starts (a job still running counts up to `now`, provisional). Their
events are read in chunks of job ids, attributed once per day, cut at the day's bounds
(`rollup.job_day`) and rolled up; the day's rows then replace the old ones in one
transaction, so a rerun, or a rerun racing another, never leaves a day half old.

Two rollups of one day at once both succeed, the later to commit standing: their
replacing transactions take turns. SQLite's writers take turns anyway (BEGIN IMMEDIATE,
store/engine.py). On PostgreSQL each takes the day's transaction-level advisory lock
first (`pg_advisory_xact_lock`, released at commit): without it, the second's DELETE,
having waited for the first's row locks, skipped the rows the first had just inserted
(they were not in its snapshot) and its INSERT then failed on their keys.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, cast

import msgspec
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_ett.ett.events import Event, EventError, decode_stored, stored_event_id
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.rollup.figures import US_PER_H, US_PER_S
from airflow_ett.rollup.job_day import FailureInDay, JobDay
from airflow_ett.store.schema import daily_days, daily_groups, daily_jobs, events, jobs

if TYPE_CHECKING:
    from airflow_ett.ett.attribution import JobAttribution
    from airflow_ett.rollup import ComponentsConfig, DayPart, DayRollup, DayWindow
    from airflow_ett.rollup.compare import PartSums

log = logging.getLogger(__name__)

T = TypeVar("T")

_JOB_CHUNK: Final = 400  # job ids per IN (...) read
_ROW_CHUNK: Final = 2000  # rows per INSERT batch
_DAG_CHUNK: Final = 500  # DAG ids per IN (...) of `job_rows` and `job_days`


def _json(value: object) -> str:
    return json.dumps(msgspec.to_builtins(value), separators=(",", ":"))


# gc=False: decoded from JSON, they can hold no reference cycle, so the cyclic collector
# need not track them (a two-week restricted page decodes tens of thousands).
class _FailureOfRow(msgspec.Struct, frozen=True, gc=False):
    cause: str
    ttr_s: float | None = None


class _PayloadOfRow(msgspec.Struct, frozen=True, gc=False):
    """`ett_daily_jobs.payload` as `_job_row` writes it."""

    components_s: dict[str, float] = {}
    tts_s: float | None = None
    failures: list[_FailureOfRow] = []
    attempts: int = 0
    preempted_attempts: int = 0
    silent: bool = False
    slow_steps_s: float | None = None  # None: a row stored before the figure (0035)


_payload_of_row: Final = msgspec.json.Decoder(_PayloadOfRow)


def _job_day_of(job: str, tenant: str, model: str, dag_id: str | None, run_id: str | None,
                gpus: int, provisional: bool, synthetic: bool, e2e_s: float,
                payload: _PayloadOfRow) -> JobDay:
    """The job-day a row was made from: seconds back to the integer microseconds they were
    divided from (exact: a day's microseconds are far below 2**53). Called for every row
    of a two-week restricted page, so it calls no helper and passes JobDay's fields by
    position (its order: job_day.py)."""
    components = payload.components_s
    if len(components) == len(COMPONENTS):  # as `_job_row` writes them: all six
        components_us = {c: round(sec * US_PER_S) for c, sec in components.items()}
    else:
        components_us = {c: round(components.get(c, 0.0) * US_PER_S) for c in COMPONENTS}
    tts_s, slow_s = payload.tts_s, payload.slow_steps_s
    failures = tuple([FailureInDay(f.cause, None if f.ttr_s is None
                                   else round(f.ttr_s * US_PER_S))
                      for f in payload.failures]) if payload.failures else ()
    return JobDay(job, tenant, model, dag_id, run_id, int(gpus), bool(provisional),
                  bool(synthetic), round(e2e_s * US_PER_S), components_us,
                  None if tts_s is None else round(tts_s * US_PER_S), failures,
                  payload.attempts, payload.preempted_attempts, payload.silent,
                  None if slow_s is None else round(slow_s * US_PER_S))


def job_day_of_row(row: Mapping[str, Any]) -> JobDay:
    """A row of `DailyRollups.job_rows` (its payload parsed) as the job-day it was made
    from: the inverse of what `replace` stores."""
    return _job_day_of(row["job"], row["tenant"], row["model"], row["dag_id"], row["run_id"],
                       row["gpus"], row["provisional"], row["synthetic"], row["e2e_s"],
                       msgspec.convert(row["payload"], _PayloadOfRow))


def _job_row(day: str, d: JobDay) -> dict[str, Any]:
    payload = {
        "components_s": {c: us / US_PER_S for c, us in d.components_us.items()},
        "tts_s": None if d.tts_us is None else d.tts_us / US_PER_S,
        "failures": [{"cause": f.cause,
                      "ttr_s": None if f.ttr_us is None else f.ttr_us / US_PER_S}
                     for f in d.failures],
        "attempts": d.attempts,
        "preempted_attempts": d.preempted_attempts,
        "silent": d.silent,
        "slow_steps_s": None if d.slow_steps_us is None else d.slow_steps_us / US_PER_S,
    }
    return {"day": day, "job": d.job, "tenant": d.tenant, "model": d.model,
            "dag_id": d.dag_id, "run_id": d.run_id, "gpus": d.gpus,
            "provisional": d.provisional, "synthetic": d.synthetic,
            "e2e_s": d.e2e_us / US_PER_S, "effective_s": d.effective_us / US_PER_S,
            "gpu_hours": d.gpu_us / US_PER_H, "gpu_hours_lost": d.lost_gpu_us / US_PER_H,
            "payload": json.dumps(payload, separators=(",", ":"))}


#: The first key of the advisory locks that serialise the replacing of a day on PostgreSQL
#: ("ETTD"); the second is the day's ordinal. Another application's locks on this database
#: would have to pick the same pair to meet ours.
_DAY_LOCK_CLASS: Final = 0x45545444


def _lock_day(conn: Connection, day: str) -> None:
    """Wait for, then hold until the transaction ends, the right to replace `day`'s rows
    (PostgreSQL; SQLite's write transactions already take turns)."""
    if conn.dialect.name == "postgresql":
        ordinal = dt.date.fromisoformat(day).toordinal()
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_DAY_LOCK_CLASS, ordinal)))


#: `ett_daily_groups.scope` of a day's parts (`rollup.parts`); their key is `_part_key`.
PART_SCOPE: Final = "part"


def _part_key(p: DayPart) -> str:
    """Unique per (DAG, tenant, model), readable in SQL: a JSON array (null: no DAG)."""
    return json.dumps([p.dag_id, p.tenant, p.model], separators=(",", ":"))


def _part_row(day: str, p: DayPart) -> dict[str, Any]:
    figures = p.totals.figures()
    return {"day": day, "scope": PART_SCOPE, "key": _part_key(p), "jobs": figures.jobs,
            "ett_pct": figures.ett_pct, "gpu_hours": figures.gpu_hours,
            "gpu_hours_lost": figures.gpu_hours_lost,
            "gpu_hours_lost_to_slow_steps": figures.gpu_hours_lost_to_slow_steps,
            "payload": _json(p)}


def _group_rows(r: DayRollup) -> list[dict[str, Any]]:
    rows = []
    for scope, groups in (("tenant", r.tenants), ("model", r.models)):
        for key, g in groups.items():
            rows.append({"day": r.day, "scope": scope, "key": key, "jobs": g.jobs,
                         "ett_pct": g.ett_pct, "gpu_hours": g.gpu_hours,
                         "gpu_hours_lost": g.gpu_hours_lost,
                         "gpu_hours_lost_to_slow_steps": g.gpu_hours_lost_to_slow_steps,
                         "payload": _json(g)})
    for team in r.teams:  # a team owns components: slow steps are inside one, NULL
        rows.append({"day": r.day, "scope": "team", "key": team.team, "jobs": r.fleet.jobs,
                     "ett_pct": None, "gpu_hours": None,
                     "gpu_hours_lost": team.gpu_hours_lost,
                     "gpu_hours_lost_to_slow_steps": None, "payload": _json(team)})
    return rows


class RowAccess(Protocol):
    """What the daily rows need of a store (`EttStore` is one): its masked URL for logs,
    and a read and a write transaction (the write retried on a busy database). Typed so,
    this module imports nothing of store.py, which imports it (lazily)."""

    @property
    def url(self) -> str: ...

    def _read(self, fn: Callable[[Connection], T]) -> T: ...

    def _write(self, fn: Callable[[Connection], T]) -> T: ...


class DailyRollups:
    """The `ett_daily_*` rows of one store (`EttStore.daily`)."""

    def __init__(self, store: RowAccess) -> None:
        self._store = store

    # -- reading what a day needs --------------------------------------------------

    def jobs_touching(self, lo: float, hi: float, *, silent_after_s: float = 0.0) -> list[str]:
        """Jobs whose `[submitted, ended)` can overlap `[lo, hi)`, by id. A job whose
        submission has not arrived is placed by its events (its first is at most its
        last); one that has not ended counts up to now, or, with `silent_after_s`, up to
        that long after its last event."""
        started_before = sa.or_(jobs.c.submitted_ts < hi,
                                sa.and_(jobs.c.submitted_ts.is_(None),
                                        jobs.c.last_event_ts >= lo))
        unended: sa.ColumnElement[bool] = jobs.c.ended_ts.is_(None)
        if silent_after_s > 0:
            unended = sa.and_(unended, jobs.c.last_event_ts + silent_after_s >= lo)
        not_over = sa.or_(unended, jobs.c.ended_ts >= lo)
        query = sa.select(jobs.c.job).where(started_before, not_over).order_by(jobs.c.job)
        return list(self._store._read(lambda conn: conn.scalars(query).all()))

    def _events_by_job(self, conn: Connection, ids: Sequence[str]) -> dict[str, list[Event]]:
        """The jobs' events, in order. Only the job and the payload are read: the id is in
        the payload, and reading its column for every event cost a fifth of the fetch
        (bench/RESULTS.md, the nightly rollup rerun for decision 0035)."""
        rows = conn.execute(
            sa.select(events.c.job, events.c.payload)
            .where(events.c.job.in_(ids)).order_by(events.c.job, events.c.ts, events.c.seq)
        ).all()
        out: dict[str, list[Event]] = {job: [] for job in ids}
        for job, payload in rows:
            try:
                out[job].append(decode_stored(payload))
            except EventError as exc:  # stored before a rule tightened: skip, say so
                log.warning("ETT store %s: job %r: stored event %r left out of the rollup: "
                            "%s", self._store.url, job, stored_event_id(payload), exc)
        return out

    def attributions(self, lo: float, hi: float, *, now: float,
                     silent_after_s: float = 0.0) -> Iterator[JobAttribution]:
        """The attribution of every job touching `[lo, hi)`, a chunk of jobs at a time.

        With `silent_after_s`, a job that has not ended is attributed as of
        `min(now, its last event + silent_after_s)`: one whose worker died unseen (or
        whose events were lost) stops adding lost time a bound after it fell silent,
        instead of in every later day (decision 0010). Its `ended_at` is then before `now`
        (`silent`)."""
        from airflow_ett.ett.attribution import AttributionError, attribute_job

        ids = self.jobs_touching(lo, hi, silent_after_s=silent_after_s)
        for start in range(0, len(ids), _JOB_CHUNK):
            chunk = ids[start:start + _JOB_CHUNK]
            by_job = self._store._read(partial(self._events_by_job, ids=chunk))
            for job in chunk:
                evs = by_job[job]
                as_of = now
                if silent_after_s > 0 and evs:
                    as_of = min(now, max(e.ts for e in evs) + silent_after_s)
                try:
                    yield attribute_job(evs, now=as_of)
                except AttributionError as exc:
                    log.warning("ETT store %s: job %r left out of the rollup: %s",
                                self._store.url, job, exc)

    # -- computing and keeping days ------------------------------------------------

    def compute_day(self, window: DayWindow, components: ComponentsConfig, *, now: float,
                    cut_pct: float = 50.0, start_s: float = 60.0,
                    silent_after_s: float = 0.0) -> DayRollup:
        """Roll the day up from the store's events and replace its rows."""
        from airflow_ett.rollup import day_parts, job_day, rollup_of_parts

        # silent in this day: cut by the bound before the day (or now) ends, so it lost
        # time here. A job running up to `now` ends at `now` rounded to the microsecond:
        # hence the millisecond of slack, and no bound means nobody is silent.
        cut = [job_day(a, window, gpus=a.world_size, synthetic=a.synthetic,
                       silent=silent_after_s > 0 and a.provisional
                       and a.ended_at + 1e-3 < min(now, window.hi))
               for a in self.attributions(window.lo, window.hi, now=now,
                                          silent_after_s=silent_after_s)]
        days = [d for d in cut if d is not None]
        parts = day_parts(days, cut_pct=cut_pct, start_s=start_s)
        rollup = rollup_of_parts(window, parts, components, computed_at=now, cut_pct=cut_pct,
                                 start_s=start_s, silent_after_s=silent_after_s)
        self.replace(rollup, days, parts)
        return rollup

    def compute(self, windows: Iterable[DayWindow], components: ComponentsConfig, *,
                now: float, cut_pct: float = 50.0, start_s: float = 60.0,
                silent_after_s: float = 0.0,
                advance: Callable[[int], None] | None = None) -> list[DayRollup]:
        out = []
        for window in windows:
            out.append(self.compute_day(window, components, now=now, cut_pct=cut_pct,
                                        start_s=start_s, silent_after_s=silent_after_s))
            if advance is not None:
                advance(1)
        return out

    def replace(self, rollup: DayRollup, job_days: Sequence[JobDay],
                parts: Sequence[DayPart]) -> None:
        """The day's rows become these, in one transaction: the day, its groups, its parts
        (as group rows of scope `part`) and its job-days."""
        day = rollup.day
        fleet = rollup.fleet
        day_row = {"day": day, "tz": rollup.tz, "lo": rollup.lo, "hi": rollup.hi,
                   "computed_at": rollup.computed_at, "provisional": rollup.provisional,
                   "jobs": fleet.jobs, "ett_pct": fleet.ett_pct, "gpu_hours": fleet.gpu_hours,
                   "gpu_hours_lost": fleet.gpu_hours_lost,
                   "gpu_hours_lost_to_slow_steps": fleet.gpu_hours_lost_to_slow_steps,
                   "payload": _json(rollup)}
        group_rows = _group_rows(rollup) + [_part_row(day, p) for p in parts]
        job_rows = [_job_row(day, d) for d in job_days]

        def write(conn: Connection) -> None:
            _lock_day(conn, day)
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

    def last_day(self) -> str | None:
        """The newest stored day (ISO date), or None when no day is stored: where the pages
        can point a user whose window holds no rollup (the nightly DAG stopped)."""
        newest: str | None = self._store._read(
            lambda conn: conn.scalar(sa.select(sa.func.max(daily_days.c.day))))
        return newest

    def dag_ids_of_day(self, day: str) -> set[str | None]:
        """The DAGs the day's job rows belong to (None: a job of no DAG), read from the
        `(day, dag_id)` index alone."""
        query = sa.select(daily_jobs.c.dag_id).where(daily_jobs.c.day == day).distinct()
        return set(self._store._read(lambda conn: conn.scalars(query).all()))

    def _by_dags(self, query: sa.Select[Any], dag_ids: Iterable[str] | None
                 ) -> tuple[list[str], list[sa.Row[Any]]]:
        """The query's column names and rows; with `dag_ids`, only the rows of those DAGs,
        `_DAG_CHUNK` ids per `IN (...)` (bound parameters are capped per statement: 999
        on old SQLite builds), in one read transaction."""
        if dag_ids is None:
            queries = [query]
        else:
            wanted = sorted(set(dag_ids))
            queries = [query.where(daily_jobs.c.dag_id.in_(wanted[i:i + _DAG_CHUNK]))
                       for i in range(0, len(wanted), _DAG_CHUNK)]
        keys = [str(c.key) for c in query.selected_columns]
        if not queries:
            return keys, []

        def read(conn: Connection) -> list[sa.Row[Any]]:
            return [row for q in queries for row in conn.execute(q).all()]

        return keys, self._store._read(read)

    def job_rows(self, day: str, *, dag_ids: Iterable[str] | None = None,
                 limit: int | None = None) -> list[dict[str, Any]]:
        """The day's job rows, the most GPU-hours lost first (ties by job id), payload
        parsed; with `dag_ids`, only the rows of those DAGs (a job of no DAG is then left
        out), filtered in SQL on the `(day, dag_id)` index.

        With `dag_ids` the rows are sorted here, not by the database: given an ORDER BY,
        SQLite (no table statistics) walks the day in `(day, gpu_hours_lost)` index order
        instead, reading every row of the day to filter them."""
        query = sa.select(daily_jobs).where(daily_jobs.c.day == day)
        if dag_ids is None:
            query = query.order_by(daily_jobs.c.gpu_hours_lost.desc(), daily_jobs.c.job)
            if limit is not None:
                query = query.limit(limit)
        keys, rows = self._by_dags(query, dag_ids)
        if dag_ids is not None:
            rows.sort(key=lambda r: (-r.gpu_hours_lost, r.job))
            if limit is not None:
                del rows[limit:]
        at = keys.index("payload")
        out = []
        for row in rows:  # names once, not per row: `row._mapping` costs ~7 us a row
            item = dict(zip(keys, row, strict=True))
            item["payload"] = msgspec.json.decode(row[at])
            out.append(item)
        return out

    def job_days(self, day: str, *, dag_ids: Iterable[str] | None = None) -> list[JobDay]:
        """The job-days the day's rows were made from (in no order: `rollup_day` sorts);
        with `dag_ids`, those of these DAGs only, filtered in SQL as `job_rows` does.

        What the pages re-roll for a user who may read some DAGs, a two-week view reading
        every row of its days: only the columns a job-day needs, the payload decoded by
        msgspec into its own struct, no dict per row (about 6 us a row with the read on
        this project's VM, where `job_rows` + `job_day_of_row` take about 24)."""
        c = daily_jobs.c
        query = sa.select(c.job, c.tenant, c.model, c.dag_id, c.run_id, c.gpus,
                          c.provisional, c.synthetic, c.e2e_s, c.payload).where(c.day == day)
        _, rows = self._by_dags(query, dag_ids)
        decode = _payload_of_row.decode
        return [_job_day_of(job, tenant, model, dag_id, run_id, gpus, provisional, synthetic,
                            e2e_s, decode(payload))
                for (job, tenant, model, dag_id, run_id, gpus, provisional, synthetic, e2e_s,
                     payload) in cast("list[tuple[Any, ...]]", rows)]

    def parts(self, day: str) -> list[DayPart]:
        """The day's parts (`rollup.parts`), in key order; none for a day stored before
        parts were (its job rows still make them: `rollup.day_parts`)."""
        from airflow_ett.rollup import DayPart

        c = daily_groups.c
        query = sa.select(c.payload).where(c.day == day, c.scope == PART_SCOPE)
        payloads = self._store._read(lambda conn: conn.scalars(query).all())
        decoder = msgspec.json.Decoder(DayPart)
        return sorted((decoder.decode(payload) for payload in payloads), key=lambda p: p.key)

    def window_parts(self, first: str, last: str) -> dict[str, list[PartSums]]:
        """The parts of every stored day in `[first, last]` (ISO dates), by day, oldest
        first, in two queries, as the sums a comparison reads (`rollup.compare.PartSums`:
        the rest of each part's JSON is skipped): what `airflow-ett report --compare`
        splits a change by. A day stored before its parts counted GPUs
        (`DayPart.gpu_counts`), or before parts were, is made again from its job rows
        (`rollup.day_parts`)."""
        from airflow_ett.rollup import day_parts
        from airflow_ett.rollup.compare import PartSums, sums_of

        d, g = daily_days.c, daily_groups.c
        names = sa.select(d.day, d.jobs).where(d.day >= first, d.day <= last).order_by(d.day)
        rows = (sa.select(g.day, g.payload)
                .where(g.day >= first, g.day <= last, g.scope == PART_SCOPE))

        def read(conn: Connection) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
            return ([(day, count) for day, count in conn.execute(names).all()],
                    [(day, payload) for day, payload in conn.execute(rows).all()])

        days, payloads = self._store._read(read)
        out: dict[str, list[PartSums]] = {day: [] for day, _ in days}
        decode = msgspec.json.Decoder(PartSums).decode
        for day, payload in payloads:
            if day in out:
                out[day].append(decode(payload))
        for day, count in days:
            parts = out[day]
            if count and (not parts or any(p.totals.jobs and not p.gpu_counts for p in parts)):
                out[day] = [sums_of(p) for p in day_parts(self.job_days(day), cut_pct=50.0,
                                                          start_s=60.0)]
            else:
                parts.sort(key=lambda p: (p.dag_id or "", p.tenant, p.model))
        return out

    def group_rows(self, day: str, scope: str) -> list[dict[str, Any]]:
        query = (sa.select(daily_groups)
                 .where(daily_groups.c.day == day, daily_groups.c.scope == scope)
                 .order_by(daily_groups.c.key))
        rows = self._store._read(lambda conn: conn.execute(query).all())
        return [{**row._mapping, "payload": json.loads(row.payload)} for row in rows]
