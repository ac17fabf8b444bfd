"""Stage 4, implied timeline: the job's wall time labelled from progress and the shape of
the attempts alone, before any explicit phase is laid over it.

Guarantees: the timeline covers `[submit, end)` exactly, without gaps or overlaps. A
progress span is `effective_steps` where its cursor passes the job's high-water mark (the
largest cursor any earlier span reached), `replay` where it does not, split in proportion
to the cursor where it straddles the mark. Every other moment gets one of
`IMPLIED_LABELS`, from where it lies: `queued` before the first attempt, `rescheduling`
between attempts, `startup_other` before an attempt's first step, `loop_gap` between
steps, `detection` from a failed attempt's last step to the moment its failure was
noticed, then `failed_attempt_shutdown`, `shutdown_other` after a finished attempt's last
step, `gpu_release` after the last attempt.

Progress spans are nearly all of a log, so `_lay_steps` is the second hot loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.attempts import ClosedAttempt
from airflow_ett.ett.attribution.collect import Span
from airflow_ett.ett.attribution.window import JobWindow
from airflow_ett.ett.timeline import Timeline

EFFECTIVE_LABEL = "effective_steps"
REPLAY_LABEL = "replay"
# Labels the model infers where nobody reported anything; any explicit phase may replace them.
IMPLIED_LABELS = frozenset(
    {
        "queued",
        "rescheduling",
        "startup_other",
        "loop_gap",
        "detection",
        "failed_attempt_shutdown",
        "shutdown_other",
        "gpu_release",
    }
)
# Below every cursor the event format allows (Int64): "no high-water mark yet".
_NO_MARK = -(2**63) - 1


@dataclass(frozen=True, slots=True)
class Implied:
    timeline: Timeline
    last_progress: Mapping[str, int]  # attempt id -> end of its last progress (if it made any)


def implied_timeline(window: JobWindow, attempts: Sequence[ClosedAttempt]) -> Implied:
    base = Timeline()
    add = base.add
    last_progress: dict[str, int] = {}
    hwm = _NO_MARK
    t_prev = window.submit
    for i, a in enumerate(attempts):
        add(t_prev, a.start, "queued" if i == 0 else "rescheduling")
        t, hwm = _lay_steps(add, a.spans, a.start, a.end, hwm)
        if a.spans:
            last_progress[a.id] = t
        _lay_ending(add, a, t)
        t_prev = a.end
    if not attempts:
        add(window.submit, window.end, "queued")
    elif window.provisional and attempts[-1].status == "failed":
        add(t_prev, window.end, "rescheduling")  # waiting for the next try
    else:
        add(t_prev, window.end, "gpu_release")
    return Implied(base, last_progress)


def _lay_steps(add: Callable[[int, int, str], None], spans: Sequence[Span], start: int,
               end: int, hwm: int) -> tuple[int, int]:
    """Lay one attempt's spans (clipped to `[start, end]`, in order, each from where the
    previous one ended) and the gaps before them. Returns the end of the last span (or
    `start`) and the high-water mark after them."""
    t = start
    gap = "startup_other"
    for span_start, span_end, c0, c1, _steps in spans:
        lo = span_start if span_start > t else t
        if lo > end:
            lo = end
        hi = span_end if span_end > lo else lo
        if hi > end:
            hi = end
        if lo > t:
            add(t, lo, gap)
        gap = "loop_gap"
        if c1 <= hwm or c1 == c0:
            add(lo, hi, REPLAY_LABEL)
        elif c0 >= hwm:
            add(lo, hi, EFFECTIVE_LABEL)
        else:  # straddles the high-water mark: split in proportion to the cursor
            cut = lo + (hi - lo) * (hwm - c0) // (c1 - c0)
            add(lo, cut, REPLAY_LABEL)
            add(cut, hi, EFFECTIVE_LABEL)
        if c1 > hwm:
            hwm = c1
        t = hi  # start <= t <= end, so hi >= lo >= t
    return t, hwm


def _lay_ending(add: Callable[[int, int, str], None], a: ClosedAttempt, t: int) -> None:
    """From an attempt's last progress `t` (its start if it made none) to its end."""
    if a.status == "failed":
        detected = a.end if a.detected is None else min(max(a.detected, t), a.end)
        add(t, detected, "detection" if a.spans else "startup_other")
        add(detected, a.end, "failed_attempt_shutdown")
    elif a.status == "success":
        add(t, a.end, "shutdown_other" if a.spans else "startup_other")
    else:  # still running
        add(t, a.end, "loop_gap" if a.spans else "startup_other")
