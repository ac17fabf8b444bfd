"""After collect: each rank's own step time, and the straggler rank when there is one.

In a synchronous job every rank's step lasts as long as the slowest rank's: the others
wait for it in the collectives. A rank's wall step time therefore says nothing about who
is slow; its **own** time does, the step time less what it spent waiting for the others
(`rank_steps` events: `busy_s` and `wait_s`, sent by every rank; decision 0033).

Per attempt (a retry may land on other hosts, so a straggler is an attempt's), each rank's
reports are read as per-step own times (`busy_s / steps`). Its first report of the
attempt is warm-up (compilation, the first batches) and is left out when it has others.
A rank's **step time** is the steps-weighted median of its steady reports, so that one
noisy report does not move it. A rank is the attempt's **straggler** when

- its step time exceeds the median of the *other* ranks' by more than 10% (the others'
  median, so that with two ranks each is compared with the other, and with many one
  slow rank does not move its own baseline), and
- it was that much slower in at least 75% of its steady steps (consistently, not once),
  over at least `MIN_REPORTS` steady reports.

At most one rank per attempt is named (the slowest such): with two slow ranks of many,
each is still compared with the median of the rest, and the page shows every rank's time.
`lost_us` is what waiting for it cost: per steady report, the excess of its per-step time
over the others' median, times the report's steps. Every other rank waited about that
long; it is wall time of the whole job (multiply by the world size for GPU time).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Final, NamedTuple

from airflow_ett.ett.events import RankSteps

#: How much slower than the others' median a rank's step is before it counts as slow.
SLOW_RATIO = 1.10
#: The share of a straggler's steady steps that must be slow ("consistently slower").
CONSISTENT_SHARE = 0.75
#: Fewer steady reports than this name nobody: a few seconds of steps prove nothing.
MIN_REPORTS = 3


@dataclass(frozen=True, slots=True)
class RankTime:
    """One rank's own step time over the job's steady reports (every attempt's)."""

    rank: int
    reports: int
    steps: int
    busy_step_us: float  # steps-weighted median of its per-step own time
    wait_step_us: float  # its mean wait per step for the other ranks


@dataclass(frozen=True, slots=True)
class Straggler:
    """The rank of an attempt that the others consistently waited for."""

    attempt: str
    rank: int
    busy_step_us: float
    others_step_us: float  # the median of the other ranks' step times
    slow_share: float  # of its steady steps, the share in reports slower than SLOW_RATIO
    lost_us: int  # wall time the job spent waiting for it


@dataclass(frozen=True, slots=True)
class RankStepTimes:
    """Every reporting rank's step time (`ranks`, by rank) and each attempt's straggler."""

    ranks: tuple[RankTime, ...]
    stragglers: tuple[Straggler, ...]


class _Report(NamedTuple):
    """One report, per step. `_waited` and `_straggler` read it by place (`Rep`), so that
    `live_ranks` may keep plain tuples of these numbers, which the garbage collector stops
    tracking (a named tuple it tracks: a day of 8 ranks is 70k objects)."""

    step_start: int
    steps: int
    busy_us: float  # per step
    wait_us: float  # per step


Rep = tuple[int, int, float, float]
"""A report by place: first step, steps, per-step own time, per-step wait (`_Report`)."""
_STEPS: Final = 1
_BUSY: Final = 2
_WAIT: Final = 3


def _weighted_median(pairs: Iterable[tuple[float, int]]) -> float:
    """The value at half the total weight of `(value, weight)` pairs (weights > 0)."""
    return _median_of(sorted(pairs))


def _median_of(ordered: Sequence[tuple[float, int]]) -> float:
    """`_weighted_median` of pairs sorted already: the first value whose running weight
    reaches half the total. Weights are steps (integers), so the running sums are exact
    and taken in C (`live_ranks` asks this of a day of reports at every page refresh)."""
    seen = list(itertools.accumulate(map(operator.itemgetter(1), ordered)))
    at = bisect.bisect_left(seen, seen[-1] / 2.0)
    return ordered[at][0] if at < len(ordered) else ordered[-1][0]


def _steady(reports: list[_Report]) -> list[_Report]:
    """A rank's reports of one attempt but the first (warm-up), unless it is all there is."""
    reports.sort(key=lambda r: r.step_start)
    return reports[1:] if len(reports) > 1 else reports


def _report(e: RankSteps) -> _Report:
    steps = e.step_end - e.step_start
    return _Report(e.step_start, steps, e.busy_s * 1e6 / steps, e.wait_s * 1e6 / steps)


def _by_attempt_and_rank(events: Iterable[RankSteps]) -> dict[str, dict[int, list[_Report]]]:
    out: dict[str, dict[int, list[_Report]]] = {}
    for e in events:
        out.setdefault(e.attempt, {}).setdefault(e.rank, []).append(_report(e))
    return out


def _waited(reports: Iterable[Rep], total: float = 0) -> float:
    """`total` and the reports' wait, added one by one in their order (a float sum: the
    order is part of the figure, `live_ranks` carries it on)."""
    return functools.reduce(operator.add, (r[_WAIT] * r[_STEPS] for r in reports), total)


def _straggler(attempt: str, ranks: Mapping[int, Sequence[Rep]],
               step_us: dict[int, float] | None = None) -> Straggler | None:
    """The attempt's straggler among its ranks' steady reports (in the order the ranks
    first reported; `step_us`: their step times, when known)."""
    if len(ranks) < 2:
        return None
    if step_us is None:
        step_us = {rank: _weighted_median((r[_BUSY], r[_STEPS]) for r in reports)
                   for rank, reports in ranks.items()}
    found: Straggler | None = None
    for rank, reports in ranks.items():
        if len(reports) < MIN_REPORTS:
            continue
        others = median(v for q, v in step_us.items() if q != rank)
        if step_us[rank] <= SLOW_RATIO * others:
            continue
        steps = sum(r[_STEPS] for r in reports)
        slow = sum(r[_STEPS] for r in reports if r[_BUSY] > SLOW_RATIO * others)
        if slow < CONSISTENT_SHARE * steps:
            continue
        lost = sum(max(0.0, r[_BUSY] - others) * r[_STEPS] for r in reports)
        if found is None or step_us[rank] > found.busy_step_us:
            found = Straggler(attempt=attempt, rank=rank, busy_step_us=step_us[rank],
                              others_step_us=others, slow_share=slow / steps,
                              lost_us=round(lost))
    return found


def rank_step_times(events: Sequence[RankSteps]) -> RankStepTimes | None:
    """Every rank's step time and each attempt's straggler; None without any report."""
    if not events:
        return None
    by_attempt = _by_attempt_and_rank(events)
    steady: dict[str, dict[int, list[_Report]]] = {
        attempt: {rank: _steady(reports) for rank, reports in ranks.items()}
        for attempt, ranks in by_attempt.items()}
    pooled: dict[int, list[_Report]] = {}
    for ranks in steady.values():
        for rank, reports in ranks.items():
            pooled.setdefault(rank, []).extend(reports)
    rows = []
    for rank in sorted(pooled):
        reports = pooled[rank]
        steps = sum(r.steps for r in reports)
        rows.append(RankTime(
            rank=rank, reports=len(reports), steps=steps,
            busy_step_us=_weighted_median((r.busy_us, r.steps) for r in reports),
            wait_step_us=_waited(reports) / steps))
    stragglers = [s for attempt in sorted(steady)
                  if (s := _straggler(attempt, steady[attempt])) is not None]
    return RankStepTimes(ranks=tuple(rows), stragglers=tuple(stragglers))
