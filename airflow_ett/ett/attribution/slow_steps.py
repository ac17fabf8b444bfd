"""After the timeline: slow steps, a Level-3 measure inside effective training.

ETT% keeps its definition: a step that moves the cursor past the high-water mark is
effective, however long it took. Inside that time, this stage says how much went to steps
slower than the job's own **ideal step time**: the steps-weighted median of the per-step
time of its *steady* progress spans (every span but the first of each attempt, which
carries the warm-up: the first iterations after a start or a restore). A median, so that
a minority of slow spans (a noisy neighbour, a straggling rank, a slow data shard) does
not move the baseline they are measured against; steps-weighted, so that a reporter that
sends progress every step and one that sends it every 100 steps give the same figure.

Per span, on its effective part only (where the cursor passes the high-water mark, split
in proportion to the cursor as the timeline is): the time the final timeline labels
effective there (a checkpoint's blocking time laid over a span is wasted training, never
a slow step) against `effective steps x ideal`; what exceeds it is lost to slow steps.
Faster spans do not pay for slower ones: the loss is a sum of excesses, at most the
effective time. Exact microseconds except the ideal itself (a ratio).

Rank 0 reports progress, so this is the job's step time as rank 0 saw it: in a
synchronous job, every rank's step waits for the slowest, so rank 0's slow steps are the
job's, whichever rank caused them.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from airflow_ett.ett.attribution.attempts import ClosedAttempt
from airflow_ett.ett.attribution.collect import Span
from airflow_ett.ett.phases import EFFECTIVE
from airflow_ett.ett.timeline import Timeline

_NO_MARK = -(2**63) - 1


@dataclass(frozen=True, slots=True)
class SlowSteps:
    """A job's slow-step figures. `ideal_step_us`: the baseline per-step time; `lost_us`:
    effective time above it; steps are fractional where a span straddles the mark."""

    ideal_step_us: float
    effective_steps: float
    steady_steps: float  # the steps the baseline was taken over
    spans: int  # effective spans measured
    slow_spans: int  # of those, the ones slower than the ideal by more than 10%
    lost_us: int
    effective_us: int  # the effective time the spans hold (what `lost_us` is part of)


@dataclass(slots=True)
class _Measured:
    """The effective part of every progress span with steps, in the job's order: flat
    lists (a job reporting every step has a span per step: millions), and the steps at
    each per-step time (us), of steady spans and of attempts' first spans apart."""

    steps: list[float]
    us: list[int]
    steady: dict[float, float]
    warm_up: dict[float, float]
    warm: list[int]  # the spans (their places in `steps` and `us`) counted as warm-up

    @classmethod
    def empty(cls) -> _Measured:
        return cls([], [], {}, {}, [])

    def copy(self) -> _Measured:
        return _Measured(list(self.steps), list(self.us), dict(self.steady),
                         dict(self.warm_up), list(self.warm))


@dataclass(frozen=True, slots=True)
class Mark:
    """Where measuring stands: before span `span` of attempt `attempt` (in the window's
    order), at `t` (where the span before it ended), the cursor mark `hwm`."""

    attempt: int = 0
    span: int = 0
    t: int | None = None  # None: at the attempt's start
    hwm: int = _NO_MARK


def effective_labels(phase_components: Mapping[str, str]) -> frozenset[str]:
    return frozenset(label for label, c in phase_components.items() if c == EFFECTIVE)


def measure(out: _Measured, attempts: Sequence[ClosedAttempt], timeline: Timeline,
            effective: frozenset[str], at: Mark = Mark(),
            until: tuple[int, int] | None = None) -> Mark:
    """Measure the spans from `at` up to `until` (attempt, span; default: to the last)
    into `out`, as `slow_steps` does all of them at once; returns where it stopped.
    Resumed from that mark, over the same attempts and a timeline the same before the
    mark's `t`, it measures what one pass would (decision 0034)."""
    if not attempts or (until is not None and until[0] < at.attempt):
        return at
    last = len(attempts) - 1 if until is None else until[0]
    t, hwm = at.t, at.hwm
    # Each span's effective part starts at or after the last one's end, so the segment
    # walk may start at the first segment that ends after `t`.
    i = 0 if t is None else bisect.bisect_right(timeline.ends, t)
    k = at.span
    for ai in range(at.attempt, last + 1):
        a = attempts[ai]
        k0 = k if ai == at.attempt else 0
        k = until[1] if until is not None and ai == last else len(a.spans)
        spans = a.spans if k0 == 0 and k == len(a.spans) else a.spans[k0:k]
        if k0 == 0 and spans:  # its first span is warm-up
            before = len(out.us)
            t, hwm, i = _measure(out, spans[:1], timeline, effective, a.start, a.end, hwm, i,
                                 out.warm_up)
            if len(out.us) > before:
                out.warm.append(before)
            t, hwm, i = _measure(out, itertools.islice(spans, 1, None), timeline, effective,
                                 t, a.end, hwm, i, out.steady)
        else:
            t, hwm, i = _measure(out, spans, timeline, effective,
                                 a.start if k0 == 0 or t is None else t, a.end, hwm, i,
                                 out.steady)
    return Mark(last, k, t, hwm)


def _measure(out: _Measured, spans: Iterable[Span],
             timeline: Timeline, effective: frozenset[str], t: int, end: int, hwm: int,
             i: int, into: dict[float, float]) -> tuple[int, int, int]:
    """Spans of one attempt (from `t`, where the span before them ended): each one's
    effective steps and the time the timeline labels effective in its effective part (the
    cursor mark carried across attempts, and each span clipped, as `implied._lay_steps`
    does), its per-step time counted `into` a table (the warm-up or the steady one).
    Spans follow each other in time, so one index walks the timeline; the common case, a
    span inside one effective segment, is one comparison. Returns where the last span
    ended, the mark and the index."""
    add_steps, add_us = out.steps.append, out.us.append
    starts, ends, labels = timeline.starts, timeline.ends, timeline.labels
    n = len(starts)
    for span_start, span_end, c0, c1, steps in spans:
        lo = span_start if span_start > t else t
        if lo > end:
            lo = end
        hi = span_end if span_end > lo else lo
        if hi > end:
            hi = end
        if c1 > hwm and c1 != c0 and steps > 0 and hi > lo:
            if c0 >= hwm:
                cut, fraction = lo, 1.0
            else:
                cut = lo + (hi - lo) * (hwm - c0) // (c1 - c0)
                fraction = (c1 - hwm) / (c1 - c0)
            while i < n and ends[i] <= cut:
                i += 1
            if i < n and starts[i] <= cut and hi <= ends[i]:
                us = hi - cut if labels[i] in effective else 0
            else:
                us = _effective_us(starts, ends, labels, i, cut, hi, effective)
            if us > 0:
                counted = steps * fraction
                add_steps(counted)
                add_us(us)
                key = us / counted
                into[key] = into.get(key, 0.0) + counted
        if c1 > hwm:
            hwm = c1
        t = hi
    return t, hwm, i


def _effective_us(starts: list[int], ends: list[int], labels: list[str], i: int, lo: int,
                  hi: int, effective: frozenset[str]) -> int:
    """Time in `[lo, hi)` labelled with an effective-training phase, from segment `i`."""
    total = 0
    while i < len(starts) and starts[i] < hi:
        if labels[i] in effective:
            a = starts[i] if starts[i] > lo else lo
            b = ends[i] if ends[i] < hi else hi
            if b > a:
                total += b - a
        i += 1
    return total


def _weighted_median(weights: dict[float, float],
                     ordered: Sequence[float] | None = None) -> float:
    """The value at half the total weight (`value -> weight`, weights > 0; `ordered`:
    the values sorted, when kept sorted already)."""
    half = sum(weights.values()) / 2.0
    seen = 0.0
    for value in sorted(weights) if ordered is None else ordered:
        seen += weights[value]
        if seen >= half:
            return value
    return max(weights)


def slow_steps(attempts: Sequence[ClosedAttempt], timeline: Timeline,
               phase_components: Mapping[str, str]) -> SlowSteps | None:
    """The job's slow steps; None when it has no effective step to measure."""
    m = _Measured.empty()
    measure(m, attempts, timeline, effective_labels(phase_components))
    return finish(m)


def finish(m: _Measured) -> SlowSteps | None:
    """The figures of what was measured (`Finish` keeps them up to date as it grows)."""
    if not m.us:
        return None
    per_step = m.steady or m.warm_up  # no steady span: the first spans are all there is
    ideal = _weighted_median(per_step)
    steady_steps = sum(per_step.values())
    lost, slow = _loss(m.steps, m.us, ideal)
    effective_us = sum(m.us)
    return SlowSteps(ideal_step_us=ideal, effective_steps=sum(m.steps),
                     steady_steps=steady_steps, spans=len(m.us), slow_spans=slow,
                     lost_us=min(round(lost), effective_us), effective_us=effective_us)


def _loss(all_steps: list[float], all_us: list[int], ideal: float, start: int = 0,
          lost: float = 0.0, slow: int = 0) -> tuple[float, int]:
    """The time above the ideal of the spans from `start` on, added to `lost` one by one
    (a float sum in the spans' order), and how many of them were slow, added to `slow`."""
    steps_from = all_steps[start:] if start else all_steps
    us_from = all_us[start:] if start else all_us
    for steps, us in zip(steps_from, us_from, strict=True):
        excess = us - steps * ideal
        if excess > 0:
            lost += excess
            if excess > 0.1 * steps * ideal:
                slow += 1
    return lost, slow


@dataclass(slots=True)
class _Sorted:
    """A measure's per-step values sorted, with their weights, as of its first `spans`."""

    spans: int = 0
    keys: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)


class Finish:
    """`finish` of one measure that grows by appending (`measure` resumed), at the cost of
    what was appended since: the values sorted with their weights (new ones inserted),
    the sums carried on,
    the loss carried on while the ideal stays and computed again when it moves (the ideal
    is a median: it moves with new spans unless every step takes as long). Each sum is
    taken in the order `finish` takes it, so every figure is the same float
    (tests/ett/test_incremental.py).

    `of(m)` takes the measure it follows (its caches move on) or a copy of it grown
    further (caches used, not moved: a tail measured past the point kept)."""

    def __init__(self, m: _Measured) -> None:
        self.m = m
        self._sorted: dict[bool, _Sorted] = {True: _Sorted(), False: _Sorted()}
        self._sums: tuple[int, float, int] = (0, 0, 0)  # spans summed, steps, us
        self._loss: tuple[float, int, float, int] = (0.0, 0, 0.0, 0)  # ideal, spans, lost, slow
        self._last: tuple[int, SlowSteps | None] | None = None

    def of(self, m: _Measured) -> SlowSteps | None:
        keep = m is self.m
        if keep and self._last is not None and self._last[0] == len(m.us):
            return self._last[1]  # nothing measured since
        found = self._finish(m, keep)
        if keep:
            self._last = (len(m.us), found)
        return found

    def _finish(self, m: _Measured, keep: bool) -> SlowSteps | None:
        if not m.us:
            return None
        steady = bool(m.steady)
        per_step = m.steady if steady else m.warm_up
        values = self._values(m, steady, keep)
        steady_steps = sum(per_step.values())
        # `_weighted_median`: its running weight is `accumulate`'s, the same float sums
        seen = list(itertools.accumulate(values.weights))
        at = bisect.bisect_left(seen, steady_steps / 2.0)
        ideal = values.keys[at] if at < len(values.keys) else max(per_step)
        lost, slow = self._loss_of(m, ideal, keep)
        n, steps_sum, us_sum = self._sums
        steps_sum = functools.reduce(operator.add, m.steps[n:], steps_sum)
        us_sum += sum(m.us[n:])
        if keep:
            self._sums = (len(m.us), steps_sum, us_sum)
        return SlowSteps(ideal_step_us=ideal, effective_steps=steps_sum,
                         steady_steps=steady_steps, spans=len(m.us), slow_spans=slow,
                         lost_us=min(round(lost), us_sum), effective_us=us_sum)

    def _values(self, m: _Measured, steady: bool, keep: bool) -> _Sorted:
        """The per-step values of the steady spans (or the warm-up ones) sorted, with
        their weights, brought up to `m`: the values of the spans since inserted."""
        per_step = m.steady if steady else m.warm_up
        was = self._sorted[steady]
        if not was.keys or len(m.us) - was.spans > 64:
            keys = sorted(per_step)
            now = _Sorted(len(m.us), keys, [per_step[k] for k in keys])
        else:
            now = was if keep else _Sorted(was.spans, list(was.keys), list(was.weights))
            warm = set(m.warm[bisect.bisect_left(m.warm, was.spans):])
            for i in range(was.spans, len(m.us)):
                if (i in warm) == steady:
                    continue  # the other kind's
                key = m.us[i] / m.steps[i]  # as `measure` made it
                at = bisect.bisect_left(now.keys, key)
                if at < len(now.keys) and now.keys[at] == key:
                    now.weights[at] = per_step[key]
                else:
                    now.keys.insert(at, key)
                    now.weights.insert(at, per_step[key])
            now.spans = len(m.us)
        if keep:
            self._sorted[steady] = now
        return now

    def _loss_of(self, m: _Measured, ideal: float, keep: bool) -> tuple[float, int]:
        """`finish`'s loss, carried on from the last spans summed while the ideal stays
        (the same loop, the same float sum in the same order)."""
        was, n, lost, slow = self._loss
        if was != ideal:  # every span's excess moved with it
            n, lost, slow = 0, 0.0, 0
        lost, slow = _loss(m.steps, m.us, ideal, n, lost, slow)
        if keep:
            self._loss = (ideal, len(m.us), lost, slow)
        return lost, slow
