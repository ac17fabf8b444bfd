"""`EttStore`: idempotent event ingest, job rows, run queries and the summary cache.

The write path is built for several processes writing events of the same job at once
(the train task, listeners in the scheduler and on workers, a spool replay):

- Events are deduplicated by the database, on their id (INSERT ... ON CONFLICT DO
  NOTHING RETURNING id): only the rows that were really new come back, and only those
  count, bump the job's version and move its row.
- The job row is upserted in the same transaction, with the version bumped in SQL
  (`version = version + n`), never read-modified-written here, so concurrent writers
  cannot lose a bump.
- Rows are written in a fixed order (events by id, then jobs by id), so two PostgreSQL
  transactions that touch the same keys wait for each other instead of deadlocking;
  a deadlock or serialization failure that still happens is retried.
- One transaction per `insert_events` call; the caller chooses the batch size.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from airflow_ett.ett.events import (
    CheckpointSaved,
    Event,
    EventError,
    JobEnded,
    JobSubmitted,
    check_string,
    check_time,
    decode_stored,
    event_to_json,
    parse_line,
)
from airflow_ett.ett.summary import JobSummary, SummaryError, lacks_row_fields
from airflow_ett.store.engine import is_sqlite, make_engine, writer
from airflow_ett.store.errors import (
    JobNotFound,
    StoreError,
    StoreUnavailable,
    is_retryable,
    mask_url,
    translate,
)
from airflow_ett.store.schema import RUNNING, events, jobs, summaries

if TYPE_CHECKING:
    from airflow_ett.store.alerts import JobFlags, SentAlerts
    from airflow_ett.store.daily import DailyRollups
    from airflow_ett.store.follow import JobFollowers

log = logging.getLogger(__name__)

T = TypeVar("T")
Timestamp = float | datetime
_WRITE_TRIES: Final = 3
_ID_CHUNK: Final = 500  # ids per IN (...) lookup: far below SQLite's bound-variable limit


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What one `ingest` call did with its events.

    `new`: stored now. `duplicates`: ids already stored (or repeated in the batch) with
    the same content: a replay, harmless. `conflicts`: of those, ids whose content
    differs from the version that stands (a producer reusing an id: a bug to report).
    """

    new: int
    duplicates: int
    conflicts: int


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as the store knows it; `version` counts its distinct stored events."""

    job: str
    tenant: str | None
    model: str | None
    dag_id: str | None
    run_id: str | None
    submitted_ts: float | None
    ended_ts: float | None
    status: str
    last_event_ts: float
    version: int


def _seconds(value: Timestamp) -> float:
    """Unix seconds from a float or a datetime; a naive datetime is taken as UTC."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    return float(value)


def _event_type(event: Event) -> str:
    tag: str = event.__struct_config__.tag  # type: ignore[assignment]
    return tag


def _row(event: Event, now: float) -> dict[str, Any]:
    """The event's row, or `EventError` for a value the backends would not hold alike.

    Events read by the parser or sent by the emitter passed all the rules already; this
    is for events built in Python and handed straight to the store, so that SQLite and
    PostgreSQL refuse the same ones (PostgreSQL cannot hold a NUL, SQLite can) and refuse
    them before anything is written, with the field and value named. Only what the rows
    rest on is checked (strings, times, JSON encoding), not every rule: the full check
    (`validate_event`) would cost ingest a third of its speed.
    """
    attempt = getattr(event, "attempt", None)
    try:
        for name, value in (("id", event.id), ("job", event.job), ("attempt", attempt)):
            if isinstance(value, str):
                check_string(name, value)
        for name in event.TIME_FIELDS:  # the columns and queries rest on these
            value = getattr(event, name)
            if value is not None:
                check_time(name, value, float(value))
        payload = event_to_json(event)
    except EventError as exc:
        raise EventError(f"event {event.id!r} cannot be stored: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # a lone surrogate, a tensor
        raise EventError(f"event {event.id!r} cannot be stored: {exc}") from None
    return {"id": event.id, "job": event.job, "type": _event_type(event), "ts": event.ts,
            "attempt": attempt, "payload": payload, "ingested_at": now}


def _earlier(new: sa.ColumnElement[Any], old: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """True when `new` is set and comes before `old` (or `old` is unset)."""
    return sa.and_(new.is_not(None), sa.or_(old.is_(None), new < old))


def _not_earlier(new: sa.ColumnElement[Any],
                 old: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """True when `new` is set and does not come before `old` (or `old` is unset)."""
    return sa.and_(new.is_not(None), sa.or_(old.is_(None), new >= old))


def _job_deltas(new_events: Iterable[Event]) -> list[dict[str, Any]]:
    """One jobs-upsert row per job, summarizing the events that were actually new.

    Within a job, the earliest job_submitted describes the job and the latest job_ended
    ends it; the SQL upsert applies the same rule against what is already stored, so the
    outcome does not depend on the order batches arrive in.
    """
    rows: dict[str, dict[str, Any]] = {}
    for event in new_events:
        row = rows.get(event.job)
        if row is None:
            row = rows[event.job] = {
                "job": event.job, "tenant": None, "model": None, "dag_id": None,
                "run_id": None, "submitted_ts": None, "ended_ts": None, "status": RUNNING,
                "last_event_ts": event.ts, "version": 0,
            }
        row["version"] += 1
        row["last_event_ts"] = max(row["last_event_ts"], event.ts)
        if isinstance(event, JobSubmitted) and (
            row["submitted_ts"] is None or event.ts < row["submitted_ts"]
        ):
            row.update(tenant=event.tenant, model=event.model, dag_id=event.dag_id,
                       run_id=event.run_id, submitted_ts=event.ts)
        elif isinstance(event, JobEnded) and (
            row["ended_ts"] is None or event.ts >= row["ended_ts"]
        ):
            row.update(ended_ts=event.ts, status=event.status)
    return [rows[job] for job in sorted(rows)]


def _same_event(payload: str, event: Event) -> bool:
    try:
        return parse_line(payload) == event
    except EventError:  # stored before a rule tightened: not the event given now
        return False


class EttStore:
    """The ETT store at one URL. Create one per process; it owns a connection pool.

    `url` defaults to `[ett] store_url`. Nothing connects until the first call. The schema
    must exist (`airflow_ett.store.upgrade(url)`); calls on a database without it raise
    `StoreError` saying so. Connection problems raise `StoreUnavailable`.
    """

    def __init__(self, url: str | None = None) -> None:
        if url is None:
            from airflow_ett.settings import EttSettings

            url = EttSettings.load().store_url
        self._url = url
        self._engine: Engine = make_engine(url)
        self._writer: Engine = writer(self._engine)
        self._sqlite = is_sqlite(self._engine)
        insert = sqlite.insert if self._sqlite else postgresql.insert
        self._insert_events = (
            insert(events).on_conflict_do_nothing(index_elements=[events.c.id])
            .returning(events.c.id)
        )
        self._upsert_jobs = self._jobs_upsert(insert)
        self._upsert_summary = self._summary_upsert(insert)
        self._followers: JobFollowers | None = None
        self._followers_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The store's URL with the password masked, fit for logs."""
        return mask_url(self._url)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def daily(self) -> DailyRollups:
        """The nightly rollup's rows (`store/daily.py`)."""
        from airflow_ett.store.daily import DailyRollups

        return DailyRollups(self)

    @property
    def follow(self) -> JobFollowers:
        """Jobs' attributions kept between reads, each read on from where it stopped
        (`store/follow.py`): what a running job's page and gauges read every few
        seconds. One per store object, so per process."""
        with self._followers_lock:
            if self._followers is None:
                from airflow_ett.store.follow import JobFollowers

                self._followers = JobFollowers(self)
            return self._followers

    @property
    def alerts(self) -> SentAlerts:
        """What the nightly rollup's alerts reached (`store/alerts.py`)."""
        from airflow_ett.store.alerts import SentAlerts

        return SentAlerts(self)

    @property
    def flags(self) -> JobFlags:
        """Flags raised on jobs (`store/alerts.py`)."""
        from airflow_ett.store.alerts import JobFlags

        return JobFlags(self)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> EttStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EttStore({self.url!r})"

    # -- plumbing ------------------------------------------------------------------

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            raise translate(exc, self._url) from exc
        except PoolTimeout as exc:
            raise StoreUnavailable(f"ETT store {self.url} is unavailable: {exc}") from exc

    def _read(self, fn: Callable[[Connection], T]) -> T:
        with self._errors(), self._engine.connect() as conn, conn.begin():
            return fn(conn)

    def _write(self, fn: Callable[[Connection], T]) -> T:
        for attempt in range(1, _WRITE_TRIES + 1):
            try:
                with self._writer.begin() as conn:
                    return fn(conn)
            except DBAPIError as exc:
                if attempt < _WRITE_TRIES and is_retryable(exc):
                    log.info("ETT store %s: retrying a write after: %s", self.url, exc.orig)
                    continue
                raise translate(exc, self._url) from exc
            except PoolTimeout as exc:
                raise StoreUnavailable(f"ETT store {self.url} is unavailable: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _jobs_upsert(insert: Callable[[sa.Table], Any]) -> Any:
        stmt = insert(jobs)
        new = stmt.excluded
        submitted_earlier = _earlier(new.submitted_ts, jobs.c.submitted_ts)
        ended_later = _not_earlier(new.ended_ts, jobs.c.ended_ts)

        def from_submission(column: str) -> sa.ColumnElement[Any]:
            return sa.case((submitted_earlier, new[column]), else_=jobs.c[column])

        def from_end(column: str) -> sa.ColumnElement[Any]:
            return sa.case((ended_later, new[column]), else_=jobs.c[column])

        return stmt.on_conflict_do_update(
            index_elements=[jobs.c.job],
            set_={
                **{c: from_submission(c)
                   for c in ("tenant", "model", "dag_id", "run_id", "submitted_ts")},
                "ended_ts": from_end("ended_ts"),
                "status": from_end("status"),
                "last_event_ts": sa.case((new.last_event_ts > jobs.c.last_event_ts,
                                          new.last_event_ts), else_=jobs.c.last_event_ts),
                "version": jobs.c.version + new.version,
            },
        )

    @staticmethod
    def _summary_upsert(insert: Callable[[sa.Table], Any]) -> Any:
        stmt = insert(summaries)
        new = stmt.excluded
        # A slow computation from an older version must not replace a newer one.
        return stmt.on_conflict_do_update(
            index_elements=[summaries.c.job],
            set_={c: new[c] for c in ("version", "computed_at", "provisional", "payload")},
            where=summaries.c.version <= new.version,
        )

    # -- writes --------------------------------------------------------------------

    def insert_events(self, batch: Iterable[Event]) -> int:
        """Store the events not stored yet, in one transaction; return how many were new.

        An id seen before (in the store or earlier in this batch) is skipped: its first
        stored version stands. The jobs they belong to are created or updated with them.
        An event with a value the store cannot hold raises `EventError` (a ValueError)
        naming it, and nothing of the batch is written.
        """
        return self._insert(batch, compare=False).new

    def ingest(self, batch: Iterable[Event]) -> InsertResult:
        """`insert_events`, also telling replays apart from reused ids (`InsertResult`).

        Costs one primary-key lookup per event that was already stored, none for new ones,
        so a first ingest runs as fast as `insert_events`.
        """
        return self._insert(batch, compare=True)

    def _insert(self, batch: Iterable[Event], *, compare: bool) -> InsertResult:
        unique: dict[str, Event] = {}
        repeated = conflicts = 0
        for event in batch:
            kept = unique.setdefault(event.id, event)
            if kept is not event:
                repeated += 1
                if compare and kept != event:
                    conflicts += 1
        if not unique:
            return InsertResult(0, 0, 0)
        now = time.time()
        rows = [_row(unique[i], now) for i in sorted(unique)]

        def write(conn: Connection) -> tuple[int, int]:
            if self._sqlite:
                # Writers hold the lock from BEGIN IMMEDIATE on, so this cannot race.
                base = conn.scalar(sa.select(sa.func.coalesce(sa.func.max(events.c.seq), 0)))
                for offset, row in enumerate(rows, start=1):
                    row["seq"] = int(base or 0) + offset
            new_ids = conn.execute(self._insert_events, rows).scalars().all()
            if new_ids:
                conn.execute(self._upsert_jobs, _job_deltas(unique[i] for i in new_ids))
            differ = 0
            if compare and len(new_ids) < len(rows):
                differ = self._count_differing(conn, rows, set(new_ids), unique)
            return len(new_ids), differ

        new, differ = self._write(write)
        return InsertResult(new, len(unique) - new + repeated, conflicts + differ)

    @staticmethod
    def _count_differing(conn: Connection, rows: list[dict[str, Any]], new: set[str],
                         incoming: dict[str, Event]) -> int:
        """How many of the rows that were not new differ from the stored event. Equal
        canonical JSON settles it at once (the usual replay); other text is parsed and
        compared as events, so a payload written by an older version is not a conflict."""
        mine = {row["id"]: row["payload"] for row in rows if row["id"] not in new}
        ids = sorted(mine)
        differ = 0
        for start in range(0, len(ids), _ID_CHUNK):
            chunk = ids[start:start + _ID_CHUNK]
            stored = conn.execute(
                sa.select(events.c.id, events.c.payload).where(events.c.id.in_(chunk)))
            for event_id, payload in stored:
                if payload != mine[event_id] and not _same_event(payload, incoming[event_id]):
                    differ += 1
        return differ

    # -- reads ---------------------------------------------------------------------

    def ping(self) -> None:
        """Connect and run a trivial query; raise `StoreUnavailable` if that fails."""
        self._read(lambda conn: conn.execute(sa.text("SELECT 1")).scalar())

    def get_job(self, job: str) -> JobRow | None:
        row = self._read(
            lambda conn: conn.execute(sa.select(jobs).where(jobs.c.job == job)).first())
        return JobRow(**row._mapping) if row is not None else None

    def list_runs(
        self,
        since: Timestamp | None = None,
        until: Timestamp | None = None,
        tenant: str | None = None,
        model: str | None = None,
        dag_id: str | None = None,
        limit: int | None = 100,
    ) -> list[JobRow]:
        """Jobs submitted in `[since, until)`, newest first, optionally filtered.

        With a time bound, jobs whose job_submitted event has not arrived are left out
        (their submission time is unknown); without one they come last.
        """
        query = sa.select(jobs)
        if since is not None:
            query = query.where(jobs.c.submitted_ts >= _seconds(since))
        if until is not None:
            query = query.where(jobs.c.submitted_ts < _seconds(until))
        for column, value in (("tenant", tenant), ("model", model), ("dag_id", dag_id)):
            if value is not None:
                query = query.where(jobs.c[column] == value)
        query = query.order_by(jobs.c.submitted_ts.desc().nulls_last(), jobs.c.job)
        if limit is not None:
            query = query.limit(limit)
        rows = self._read(lambda conn: conn.execute(query).all())
        return [JobRow(**row._mapping) for row in rows]

    def count_events(self, job: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(events)
        if job is not None:
            query = query.where(events.c.job == job)
        return int(self._read(lambda conn: conn.scalar(query)) or 0)

    @staticmethod
    def _events_of(conn: Connection, job: str) -> list[Event]:
        payloads = conn.execute(
            sa.select(events.c.id, events.c.payload).where(events.c.job == job)
            .order_by(events.c.ts, events.c.seq)
        ).all()
        out: list[Event] = []
        unreadable: list[str] = []
        for event_id, payload in payloads:
            try:
                out.append(decode_stored(payload))
            except EventError as exc:
                # Stored before a rule tightened (a time in milliseconds, say): one bad
                # row must not make the whole job unreadable.
                unreadable.append(f"{event_id!r}: {exc}")
        if unreadable:
            log.warning("ETT store %s: job %r: %d stored event(s) left out, they break "
                        "today's rules; first: %s", mask_url(conn.engine.url), job,
                        len(unreadable), unreadable[0])
        return out

    def job_events(self, job: str) -> list[Event]:
        """The job's stored events, in time order (ingest order among equal times)."""
        return self._read(lambda conn: self._events_of(conn, job))

    def checkpoint_save_times(self, tenants: Collection[str], *,
                              since: float) -> dict[str, list[float]]:
        """The `total_s` of the non-final checkpoint saves committed at or after `since` by
        the jobs of each of `tenants` (`airflow-ett tenants check` compares them with the
        tenants' grace); see `checkpoint_saves`."""
        return {tenant: [e.total_s for e in saves]
                for tenant, saves in self.checkpoint_saves(tenants, since=since).items()}

    def checkpoint_saves(self, tenants: Collection[str], *,
                         since: float) -> dict[str, list[CheckpointSaved]]:
        """The non-final checkpoint saves committed at or after `since` by the jobs of each
        of `tenants` (the preemption controller's guess of a save's length for a job that
        has not saved yet: `scheduling/save_times.save_prior`).

        Read through the jobs table: jobs of these tenants still running or ended since
        `since`, then their `checkpoint_saved` events, so a store of many months is not
        scanned whole. A stored event that today's rules cannot decode is left out, as
        every reader of the store does."""
        query = (sa.select(jobs.c.tenant, events.c.payload)
                 .select_from(jobs.join(events, events.c.job == jobs.c.job))
                 .where(jobs.c.tenant.in_(list(tenants)),
                        sa.or_(jobs.c.ended_ts.is_(None), jobs.c.ended_ts >= since),
                        events.c.type == "checkpoint_saved", events.c.ts >= since))
        out: dict[str, list[CheckpointSaved]] = {}
        for tenant, payload in self._read(lambda conn: conn.execute(query).all()):
            try:
                event = decode_stored(payload)
            except EventError:
                continue
            if isinstance(event, CheckpointSaved) and not event.final:
                out.setdefault(tenant, []).append(event)
        return out

    # -- summaries -----------------------------------------------------------------

    def summary(self, job: str, now: float | None = None) -> dict[str, Any]:
        """The job's summary in its JSON form, as cached: what `runs show --json` prints.

        A cached result is reused while no new event arrived for the job, unless it was
        provisional (the job was still running: its numbers move with `now`) or its rows
        lack a field added since it was computed (`lacks_row_fields`: an attempt's
        `message`, which the events had all along). Raises
        `JobNotFound` for a job with no events. Readers that use the numbers want
        `job_summary`, the typed form; this one hands a stored row on as it is.
        """
        return self._summary(job, now, use_cache=True)

    def job_summary(self, job: str, now: float | None = None) -> JobSummary:
        """The job's `JobSummary`, cached like `summary`.

        A cached row that is not a summary this code reads (left by an older, laxer
        version) is computed again from the job's events, and the cache rewritten; when
        there are no events to compute it from, `SummaryError` says why.
        """
        try:
            return JobSummary.from_dict(self._summary(job, now, use_cache=True))
        except SummaryError as exc:
            log.info("ETT store %s: cached summary of %s computed again: %s", self.url, job,
                     exc)
        from airflow_ett.ett.attribution import AttributionError

        try:
            return JobSummary.from_dict(self._summary(job, now, use_cache=False))
        except AttributionError as exc:
            raise SummaryError(f"job {job!r}: the cached summary cannot be read and the "
                               f"events cannot replace it: {exc}") from None

    def _summary(self, job: str, now: float | None, *, use_cache: bool) -> dict[str, Any]:
        from airflow_ett.ett.attribution import attribute_job

        def read(conn: Connection) -> tuple[int, dict[str, Any] | None, list[Event]]:
            # The version is read before the events: if one arrives in between, it is
            # in the events but not in the version, so the cache goes stale (safe), never
            # the other way round.
            version = conn.scalar(sa.select(jobs.c.version).where(jobs.c.job == job))
            if version is None:
                raise JobNotFound(f"no events stored for job {job!r}")
            cached = conn.execute(
                sa.select(summaries.c.version, summaries.c.provisional, summaries.c.payload)
                .where(summaries.c.job == job)
            ).first() if use_cache else None
            if cached is not None and cached.version == version and not cached.provisional:
                payload = json.loads(cached.payload)
                if not lacks_row_fields(payload):  # else computed before a field was added
                    return version, payload, []
            return version, None, self._events_of(conn, job)

        version, cached, job_events = self._read(read)
        if cached is not None:
            return cached
        payload = json.dumps(attribute_job(job_events, now=now).to_dict(),
                             separators=(",", ":"))
        result: dict[str, Any] = json.loads(payload)
        row = {"job": job, "version": version, "computed_at": time.time(),
               "provisional": bool(result.get("provisional", False)), "payload": payload}
        try:
            self._write(lambda conn: conn.execute(self._upsert_summary, row))
        except StoreError as exc:
            # The result is right either way; the next call just computes it again.
            log.warning("ETT store %s: summary of %s not cached: %s", self.url, job, exc)
        return result
