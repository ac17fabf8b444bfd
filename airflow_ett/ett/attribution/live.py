"""A job's events kept as they arrive: what `collect` reads of them, updated per event
instead of read again (`incremental`, decision 0034).

Each event comes with its place in the store's order (`Key`: its time, then the store's
ingest number, as `EttStore.job_events` lists them), in any order: a late event goes to
its place. `collected()` is then what `collect` gives for all the events added, listed
in that order; it re-reads only the few events that are neither progress nor rank steps
(phases, saves, attempt and job boundaries: tens per attempt). Progress, nearly all of a
log, is kept where `collect` puts it, as each attempt's sorted spans, and `touched` says
from which span on an attempt's spans changed since `settle()`: a span that came late
lands before spans already laid, and whoever laid them must lay them again.

Guarantees, for events added with their store keys: `collected()` equals
`collect(events in key order)` but for `rank_steps`, left empty: `ranks.times()` is
`rank_step_times` of them (`live_ranks`, which keeps what it needs of each, not the
events); `published()` lists the `model_published` events in that order; `last_ts` is
the latest event time. Ids are the store's business: each event is added
once (the store holds one event per id).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Generic, TypeVar

from airflow_ett.ett.attribution.collect import Collected, Span, _Collector
from airflow_ett.ett.attribution.live_ranks import Key, LiveRankSteps
from airflow_ett.ett.events import Event, ModelPublished, Progress, RankSteps
from airflow_ett.ett.timeline import US_PER_S

T = TypeVar("T")


class _Ordered(Generic[T]):
    """Items in key order; appended in the common case (keys arrive in order)."""

    __slots__ = ("items", "keys")

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.items: list[T] = []

    def add(self, key: Key, item: T) -> None:
        if not self.keys or key > self.keys[-1]:
            self.keys.append(key)
            self.items.append(item)
        else:
            at = bisect.bisect_right(self.keys, key)
            self.keys.insert(at, key)
            self.items.insert(at, item)


class LiveEvents:
    """One job's events, added as they arrive (see the module docstring)."""

    def __init__(self) -> None:
        self._others: _Ordered[Event] = _Ordered()
        self.spans: dict[str, list[Span]] = {}  # rank 0's, per attempt, sorted
        self.touched: dict[str, int] = {}  # attempt -> its first span added since settle()
        self.jobs: set[str] = set()
        self.count = 0
        self.ranks = LiveRankSteps()  # `rank_step_times` of the rank_steps events
        self.last_ts: float | None = None
        self._earliest_rank0: int | None = None
        self._earliest_any: int | None = None

    def add(self, key: Key, e: Event) -> None:
        self.extend([(key, e)])

    def extend(self, keyed: Sequence[tuple[Key, Event]]) -> None:
        """Add events with their keys (a whole job's on its first read: the hot loop)."""
        if not keyed:
            return
        us = US_PER_S
        rnd = round
        others, spans_of = self._others, self.spans
        attempt: str | None = None
        spans: list[Span] = []
        ranked: list[tuple[Key, RankSteps]] = []
        for key, e in keyed:
            if isinstance(e, Progress):
                if e.rank:  # rank 0 alone reports progress
                    continue
                span = (rnd(e.start_ts * us), rnd(e.ts * us), e.cursor_start, e.cursor_end,
                        e.step_end - e.step_start)
                if e.attempt != attempt:
                    attempt = e.attempt
                    spans = spans_of.setdefault(attempt, [])
                if not spans or span >= spans[-1]:
                    spans.append(span)
                else:
                    self._late(attempt, spans, span)
            elif isinstance(e, RankSteps):
                ranked.append((key, e))  # kept by `ranks` only
            else:
                others.add(key, e)
        self.ranks.extend(ranked)
        self._bounds(keyed)

    def _late(self, attempt: str, spans: list[Span], span: Span) -> None:
        """A span that sorts among spans laid already: `touched` says where."""
        at = bisect.bisect_right(spans, span)
        spans.insert(at, span)
        if at < self.touched.get(attempt, at + 1):
            self.touched[attempt] = at

    def _bounds(self, keyed: Sequence[tuple[Key, Event]]) -> None:
        """The count, the jobs, the latest and earliest times, with `keyed` added."""
        self.count += len(keyed)
        self.jobs.update({e.job for _, e in keyed})
        us = US_PER_S
        rnd = round
        times = [e.ts for _, e in keyed]
        latest = max(times)
        if self.last_ts is None or latest > self.last_ts:
            self.last_ts = latest
        # as `collect` rounds an event's time (rounding keeps the order of times)
        earliest = rnd(min(times) * us)
        if self._earliest_any is None or earliest < self._earliest_any:
            self._earliest_any = earliest
        rank0 = [e.ts for _, e in keyed if not e.rank]
        if rank0:
            earliest = rnd(min(rank0) * us)
            if self._earliest_rank0 is None or earliest < self._earliest_rank0:
                self._earliest_rank0 = earliest

    def settle(self) -> None:
        """The spans as they are now are the ones laid: `touched` starts again."""
        self.touched.clear()

    def collected(self) -> Collected:
        """`collect` of every event added, in key order (see the module docstring).

        The earliest time: `collect` starts from the first rank-0 event in list order and
        keeps the earliest rank-0 time, so in the store's order (by time) it is the
        earliest rank-0 event's time, or the first event's when no event is rank 0's."""
        if self._earliest_any is None:
            raise ValueError("no events: nothing collected")
        out = _Collector()
        for e in self._others.items:
            out.note(e, round(e.ts * US_PER_S))
        for attempt, spans in self.spans.items():
            out.attempt(attempt).spans = spans  # sorted: `report` need not sort them
        out.close_rank_ends()
        earliest = self._earliest_rank0
        return out.collected(self._earliest_any if earliest is None else earliest,
                             sort_spans=False)

    def published(self) -> list[ModelPublished]:
        return [e for e in self._others.items if isinstance(e, ModelPublished)]
