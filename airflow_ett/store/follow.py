"""A job's attribution kept between reads (`EttStore.follow`): its events read once, then
only what came since, attributed again from where the last pass stopped (decision 0034).

The run page of a running job asks every 10 s, and each ask used to read, decode and
attribute every event of the job: half a second for a day of one event a second
(bench/rolling_windows.py). Here each job read keeps its `IncrementalAttribution`, and
a read fetches, in one statement (one snapshot, on PostgreSQL too), the job's `version`
(its count of stored events: bumped in the transaction that stores them) and its rows
from `lo` on, `lo` being `MARGIN_S` before the latest event time read (never earlier
than the last read's `lo`). Rows already read (their ingest numbers, `seq`, since `lo`
are kept) are skipped; the others are decoded and added where the store's order puts
them (time, then `seq`): late ones too.

Nothing is missed, whatever arrives late or commits out of order (a PostgreSQL `seq` is
taken at insert, not at commit, so `seq` alone is no cursor): rows read so far plus new
ones must make the version seen in the same snapshot (less the offset it had from the
rows when the job was first read, 0 unless a store counted otherwise once). An event
older than `lo` that arrived since breaks that count, and the job is read again whole.
Events are never deleted from the store, so the count cannot balance a loss.

Memory: what `IncrementalAttribution` keeps, about 0.3 KB per progress event (a day of
one a second: ~25 MB); at most `MAX_EVENTS` events in all, the jobs read least recently
dropped first. One lock per job: two asks for one job take turns (the second one reads
what the first left), asks for different jobs do not wait for each other.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_ett.ett.attribution import IncrementalAttribution, JobAttribution
from airflow_ett.ett.events import (
    Event,
    EventError,
    ModelPublished,
    decode_stored,
    stored_event_id,
)
from airflow_ett.store.schema import events, jobs

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Rows this much older than the latest event read are read again (and skipped when
#: known): events that arrive a little late (another process's batch, another rank's)
#: then cost nothing more; only older ones make the job be read again whole.
MARGIN_S: Final = 300.0
#: Events kept in all (about 0.3 KB each): the jobs read least recently go first.
MAX_EVENTS: Final = 1_000_000


class RowReads(Protocol):
    """What a follower needs of a store (`EttStore` is one)."""

    @property
    def url(self) -> str: ...

    def _read(self, fn: Callable[[Connection], T]) -> T: ...


@dataclass(frozen=True, slots=True)
class Followed:
    """A job's attribution at `now`, and what the run page reads of its events besides."""

    attribution: JobAttribution
    published: tuple[ModelPublished, ...]  # in the store's order
    last_ts: float  # the latest event time
    events: int  # events attributed
    read_whole: bool  # this read read the job whole (first read, or something came late)


@dataclass(slots=True)
class _Job:
    lock: threading.Lock = field(default_factory=threading.Lock)
    inc: IncrementalAttribution | None = None
    rows: int = 0  # rows read, decodable or not
    offset: int = 0  # the version less the rows, at the first read
    lo: float | None = None  # rows from here on are read again
    recent: dict[int, float] = field(default_factory=dict)  # seq -> ts of rows since `lo`
    max_ts: float = float("-inf")


class JobFollowers:
    """Jobs read so far by one store's readers (`EttStore.follow`)."""

    def __init__(self, store: RowReads, *, max_events: int = MAX_EVENTS,
                 margin_s: float = MARGIN_S) -> None:
        self._store = store
        self._max_events = max_events
        self._margin_s = margin_s
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._lock = threading.Lock()

    def attribution(self, job: str, now: float | None = None) -> Followed | None:
        """The job's attribution at `now`, exactly `attribute_job(store.job_events(job),
        now)`; None when the store has no event of it. Raises `AttributionError` as that
        would, and the store's errors."""
        entry = self._entry(job)
        try:
            with entry.lock:
                try:
                    whole = self._catch_up(job, entry)
                    inc = entry.inc
                    if inc is None or inc.count == 0:
                        self._drop(job, entry)
                        return None
                    found = inc.attribute(now)
                    last = inc.events.last_ts
                    assert last is not None  # it has events
                    return Followed(found, tuple(inc.published()), last, inc.count, whole)
                except BaseException:
                    self._drop(job, entry)  # half read or half attributed: start again
                    raise
        finally:
            self._evict(keep=job)

    def forget(self, job: str | None = None) -> None:
        """Drop what was kept of `job` (of every job when None)."""
        with self._lock:
            if job is None:
                self._jobs.clear()
            else:
                self._jobs.pop(job, None)

    @property
    def kept_events(self) -> int:
        with self._lock:
            return sum(e.rows for e in self._jobs.values())

    def _entry(self, job: str) -> _Job:
        with self._lock:
            entry = self._jobs.get(job)
            if entry is None:
                entry = self._jobs[job] = _Job()
            self._jobs.move_to_end(job)
            return entry

    def _drop(self, job: str, entry: _Job) -> None:
        with self._lock:
            if self._jobs.get(job) is entry:
                del self._jobs[job]
        entry.inc = None

    def _evict(self, keep: str) -> None:
        with self._lock:
            total = sum(e.rows for e in self._jobs.values())
            for job in list(self._jobs):
                if total <= self._max_events:
                    break
                if job != keep:
                    total -= self._jobs.pop(job).rows

    # -- reading ---------------------------------------------------------------------------

    def _catch_up(self, job: str, entry: _Job) -> bool:
        """Read what came since the last read into `entry`; whether it read the job
        whole."""
        if entry.inc is not None and entry.lo is not None:
            lo = entry.lo
            found = self._rows(job, lo)
            if found is not None:
                version, rows = found
                new = [r for r in rows if r[1] not in entry.recent]
                if entry.rows + len(new) + entry.offset == version:
                    self._add(job, entry, new)
                    self._remember(entry, rows, lo)
                    return False
        # The first read, or a row older than `lo` came: read the job whole.
        entry.inc, entry.rows, entry.recent = None, 0, {}
        entry.max_ts = float("-inf")
        found = self._rows(job, None)
        if found is None:
            return True
        version, rows = found
        entry.inc = IncrementalAttribution()
        self._add(job, entry, rows)
        entry.offset = version - len(rows)
        self._remember(entry, rows, None)
        return True

    def _rows(self, job: str, lo: float | None) -> tuple[int, Sequence[Any]] | None:
        """The job's version and its rows (version, seq, ts, payload) from `lo` on, in the
        store's order, in one statement; None without a job row. Not the id: selecting it
        costs a fifth of the fetch (bench/RESULTS.md, the rollup's read), and only a row
        that no longer decodes needs it, for its message."""
        on = events.c.job == jobs.c.job
        if lo is not None:
            on = sa.and_(on, events.c.ts >= lo)
        query = (sa.select(jobs.c.version, events.c.seq, events.c.ts, events.c.payload)
                 .select_from(jobs.outerjoin(events, on)).where(jobs.c.job == job)
                 .order_by(events.c.ts, events.c.seq))
        rows = self._store._read(lambda conn: conn.execute(query).all())
        if not rows:
            return None
        # The outer join gives one row of NULLs for a job without events since `lo`.
        return int(rows[0][0]), [] if rows[0][1] is None else rows

    def _add(self, job: str, entry: _Job, rows: Sequence[Any]) -> None:
        inc = entry.inc
        assert inc is not None
        keyed: list[tuple[tuple[float, int], Event]] = []
        unreadable: list[str] = []
        for _version, seq, ts, payload in rows:
            try:
                keyed.append(((ts, seq), decode_stored(payload)))
            except EventError as exc:
                # As `EttStore.job_events`: a row stored before a rule tightened is left
                # out, the job stays readable.
                unreadable.append(f"{stored_event_id(payload)!r}: {exc}")
        inc.extend(keyed)
        entry.rows += len(rows)
        if unreadable:
            log.warning("ETT store %s: job %r: %d stored event(s) left out, they break "
                        "today's rules; first: %s", self._store.url, job, len(unreadable),
                        unreadable[0])

    def _remember(self, entry: _Job, rows: Sequence[Any], lo: float | None) -> None:
        """Keep the rows since the next read's `lo` (`rows`: all of them since `lo`, in
        time order)."""
        if rows:
            entry.max_ts = max(entry.max_ts, rows[-1][2])
        lo = entry.max_ts - self._margin_s if lo is None else max(lo, entry.max_ts
                                                                 - self._margin_s)
        recent: dict[int, float] = {}
        for row in reversed(rows):
            if row[2] < lo:
                break
            recent[row[1]] = row[2]
        entry.recent = recent
        entry.lo = lo
