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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.attempts import ClosedAttempt
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


def _measure(attempts: Sequence[ClosedAttempt], timeline: Timeline,  # noqa: C901 (one hot loop)
             effective: frozenset[str]) -> _Measured:
    """Each span's effective steps and the time the timeline labels effective in its
    effective part (the cursor mark carried across attempts, and each span clipped, as
    `implied._lay_steps` does). Spans follow each other in time, so one index walks the
    timeline; the common case, a span inside one effective segment, is one comparison."""
    out = _Measured([], [], {}, {})
    add_steps, add_us = out.steps.append, out.us.append
    starts, ends, labels = timeline.starts, timeline.ends, timeline.labels
    n = len(starts)
    i = 0
    hwm = _NO_MARK
    for a in attempts:
        t, end = a.start, a.end
        first = True
        for span_start, span_end, c0, c1, steps in a.spans:
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
                    at = out.warm_up if first else out.steady
                    key = us / counted
                    at[key] = at.get(key, 0.0) + counted
            if c1 > hwm:
                hwm = c1
            first = False
            t = hi
    return out


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


def _weighted_median(weights: dict[float, float]) -> float:
    """The value at half the total weight (`value -> weight`, weights > 0)."""
    half = sum(weights.values()) / 2.0
    seen = 0.0
    for value in sorted(weights):
        seen += weights[value]
        if seen >= half:
            return value
    return max(weights)


def slow_steps(attempts: Sequence[ClosedAttempt], timeline: Timeline,
               phase_components: Mapping[str, str]) -> SlowSteps | None:
    """The job's slow steps; None when it has no effective step to measure."""
    effective = frozenset(label for label, c in phase_components.items() if c == EFFECTIVE)
    m = _measure(attempts, timeline, effective)
    if not m.us:
        return None
    per_step = m.steady or m.warm_up  # no steady span: the first spans are all there is
    ideal = _weighted_median(per_step)
    steady_steps = sum(per_step.values())
    lost = 0.0
    slow = 0
    for steps, us in zip(m.steps, m.us, strict=True):
        excess = us - steps * ideal
        if excess > 0:
            lost += excess
            if excess > 0.1 * steps * ideal:
                slow += 1
    effective_us = sum(m.us)
    return SlowSteps(ideal_step_us=ideal, effective_steps=sum(m.steps),
                     steady_steps=steady_steps, spans=len(m.us), slow_spans=slow,
                     lost_us=min(round(lost), effective_us), effective_us=effective_us)
