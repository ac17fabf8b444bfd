"""Rank step times kept up to date as `rank_steps` events arrive (decision 0034): what
`stragglers.rank_step_times` gives for all of them in the store's order, at the cost of
what arrived since (a job of 8 ranks sends ~70k of them a day: read again at every ask,
they took 170 ms).

Kept per (attempt, rank): its reports sorted by (first step, store key), as the stable
sort of `stragglers._steady` over the store's order leaves them, and the sorted
`(per-step time, steps)` pairs of its steady ones (all but the first), with a cursor on
their weighted median; per rank: the same over every attempt, their steps, and its wait
(a float sum in the order `rank_step_times` takes it: attempts in the order they first
reported, each attempt's steady reports in order) carried on while reports only arrive
at that order's end, summed again when one lands elsewhere. A weighted median then moves
as far as the reports since moved it; an attempt's straggler is looked for again only
when it got a report.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from airflow_ett.ett.attribution.stragglers import (
    RankStepTimes,
    RankTime,
    Rep,
    Straggler,
    _report,
    _straggler,
    _waited,
)
from airflow_ett.ett.events import RankSteps

Pair = tuple[float, int]
Key = tuple[float, int]
"""An event's place in the store's order: (time, ingest number); `live.Key`."""


class _Median:
    """Sorted `(per-step time, steps)` pairs and their weighted median
    (`stragglers._median_of`: the first pair whose running steps reach half of them all),
    kept by a cursor that moves as pairs come and go. Steps are integers, so the running
    sums are exact, whichever way the cursor got there."""

    __slots__ = ("at", "before", "pairs", "total")

    def __init__(self, pairs: list[Pair] | None = None) -> None:
        self.pairs: list[Pair] = pairs if pairs is not None else []  # sorted
        self.total = sum(w for _, w in self.pairs)
        self.at = 0  # the cursor
        self.before = 0  # the steps of the pairs before it

    def __len__(self) -> int:
        return len(self.pairs)

    def update(self, added: Iterable[Rep], removed: Iterable[Rep]) -> None:
        for r in removed:
            pair = _pair(r)
            i = bisect.bisect_left(self.pairs, pair)
            del self.pairs[i]
            self.total -= pair[1]
            if i < self.at:
                self.at -= 1
                self.before -= pair[1]
        for r in added:
            pair = _pair(r)
            i = bisect.bisect_right(self.pairs, pair)
            self.pairs.insert(i, pair)
            self.total += pair[1]
            if i <= self.at and len(self.pairs) > 1:
                self.at += 1
                self.before += pair[1]

    def value(self) -> float:
        pairs, half = self.pairs, self.total / 2.0
        if self.at >= len(pairs):
            self.at, self.before = 0, 0
        while self.at < len(pairs) - 1 and self.before + pairs[self.at][1] < half:
            self.before += pairs[self.at][1]
            self.at += 1
        while self.at > 0 and self.before >= half:
            self.at -= 1
            self.before -= pairs[self.at][1]
        return pairs[self.at][0]


@dataclass(slots=True)
class _Cell:
    """One rank's reports of one attempt."""

    first: Key  # its first report in the store's order: ranks are looked at in that order
    order: list[tuple[int, Key]] = field(default_factory=list)  # (first step, key), sorted
    reports: list[Rep] = field(default_factory=list)  # in that order
    pairs: _Median = field(default_factory=_Median)  # of its steady reports

    def sort(self) -> None:
        ordered = sorted(zip(self.order, self.reports, strict=True), key=lambda p: p[0])
        self.order = [place for place, _ in ordered]
        self.reports = [report for _, report in ordered]

    def steady(self) -> list[Rep]:
        return self.reports[1:] if len(self.reports) > 1 else self.reports

    def add(self, key: Key, report: Rep) -> tuple[list[Rep], list[Rep], bool]:
        """Add a report: the reports that became steady, those that stopped being, and
        whether the steady ones only grew at their end."""
        place = (report[0], key)
        at = bisect.bisect_right(self.order, place)
        self.order.insert(at, place)
        self.reports.insert(at, report)
        n = len(self.reports)
        if n == 1:
            return [report], [], True
        if n == 2:  # the first report alone was steady; now the second one is
            return ([], [], True) if at == 0 else ([report], [self.reports[0]], False)
        if at == 0:  # the new first is warm-up; the old first becomes steady
            return [self.reports[1]], [], False
        return [report], [], at == n - 1


def _plain(e: RankSteps) -> Rep:
    """`stragglers._report` of the event, as a plain tuple (untracked by the collector)."""
    step_start, steps, busy_us, wait_us = _report(e)
    return (step_start, steps, busy_us, wait_us)


def _pair(r: Rep) -> Pair:
    return (r[2], r[1])  # per-step own time, steps


@dataclass(slots=True)
class _Rank:
    """One rank's steady reports over every attempt."""

    pairs: _Median = field(default_factory=_Median)
    steps: int = 0
    waited: float = 0  # `_waited` of them, in order, when `fresh`
    fresh: bool = True


class LiveRankSteps:
    """`rank_step_times` of the `rank_steps` events added so far, with their store keys."""

    #: The first reports, when as many as this, are sorted in bulk (a job's first read).
    bulk_from = 64

    def __init__(self) -> None:
        self._cells: dict[str, dict[int, _Cell]] = {}
        self._first: dict[str, Key] = {}  # each attempt's first report
        self._ranks: dict[int, _Rank] = {}
        self._order: list[str] = []  # attempts in the order they first reported
        self._stragglers: dict[str, Straggler | None] = {}  # attempts looked at
        self._result: RankStepTimes | None = None

    def extend(self, keyed: Sequence[tuple[Key, RankSteps]]) -> None:
        """Add reports: one by one, or (the first ones) in bulk, as one pass would."""
        if self._cells or len(keyed) < self.bulk_from:
            for key, e in keyed:
                self.add(key, e)
        else:
            self._bulk(keyed)

    def _bulk(self, keyed: Sequence[tuple[Key, RankSteps]]) -> None:
        unsorted: set[int] = set()  # cells whose reports came out of order
        pooled: dict[int, list[Pair]] = {}
        for key, e in keyed:
            cells = self._cells.setdefault(e.attempt, {})
            cell = cells.get(e.rank)
            if cell is None:
                cell = cells[e.rank] = _Cell(first=key)
            elif key < cell.first:
                cell.first = key
            place = (e.step_start, key)
            if cell.order and place < cell.order[-1]:
                unsorted.add(id(cell))
            cell.order.append(place)
            cell.reports.append(_plain(e))
            if e.attempt not in self._first or key < self._first[e.attempt]:
                self._first[e.attempt] = key
        for cells in self._cells.values():
            for q, cell in cells.items():
                if id(cell) in unsorted:
                    cell.sort()
                steady = cell.steady()
                cell.pairs = _Median(sorted(map(_pair, steady)))
                pooled.setdefault(q, []).extend(cell.pairs.pairs)
                rank = self._ranks.setdefault(q, _Rank(fresh=False))
                rank.steps += sum(r[1] for r in steady)
        for q, rank in self._ranks.items():
            rank.pairs = _Median(sorted(pooled[q]))
            rank.fresh = False  # summed in `times`, in the attempts' order

    def add(self, key: Key, e: RankSteps) -> None:
        report = _plain(e)
        cells = self._cells.setdefault(e.attempt, {})
        cell = cells.get(e.rank)
        if cell is None:
            cell = cells[e.rank] = _Cell(first=key)
        cell.first = min(cell.first, key)
        if e.attempt not in self._first or key < self._first[e.attempt]:
            self._first[e.attempt] = key
        added, removed, grew = cell.add(key, report)
        cell.pairs.update(added, removed)
        rank = self._ranks.setdefault(e.rank, _Rank())
        rank.pairs.update(added, removed)
        rank.steps += sum(r[1] for r in added) - sum(r[1] for r in removed)
        last = self._order[-1] if self._order else None
        if rank.fresh and grew and e.attempt == last:
            # At the end of the rank's order (if this report made its attempt first report
            # earlier, the order is looked at again in `times` and every sum is redone).
            rank.waited = _waited(added, rank.waited)
        else:
            rank.fresh = False
        self._stragglers.pop(e.attempt, None)
        self._result = None

    def times(self) -> RankStepTimes | None:
        if not self._cells:
            return None
        if self._result is None:
            self._result = self._times()
        return self._result

    def _times(self) -> RankStepTimes:
        order = sorted(self._first, key=self._first.__getitem__)
        if order != self._order:
            self._order = order
            for rank in self._ranks.values():
                rank.fresh = False
        rows = []
        for r in sorted(self._ranks):
            rank = self._ranks[r]
            if not rank.fresh:
                rank.waited = _waited(report for attempt in order
                                      if (cell := self._cells[attempt].get(r)) is not None
                                      for report in cell.steady())
                rank.fresh = True
            rows.append(RankTime(rank=r, reports=len(rank.pairs), steps=rank.steps,
                                 busy_step_us=rank.pairs.value(),
                                 wait_step_us=rank.waited / rank.steps))
        stragglers = []
        for attempt in sorted(self._cells):
            if attempt not in self._stragglers:
                cells = self._cells[attempt]
                ranks = sorted(cells, key=lambda q: cells[q].first)  # as they first reported
                self._stragglers[attempt] = _straggler(
                    attempt, {q: cells[q].steady() for q in ranks},
                    {q: cells[q].pairs.value() for q in ranks})
            found = self._stragglers[attempt]
            if found is not None:
                stragglers.append(found)
        return RankStepTimes(ranks=tuple(rows), stragglers=tuple(stragglers))
