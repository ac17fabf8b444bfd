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

Resumable (`incremental`, decision 0034): with `keep=True` the result also says where the
laying of the last attempt's spans stood before its first span that the attempt's end cut
(`Laid`: the timeline so far, the mark, what it was laid from); given back as `resume`,
with the same attempts before it, its spans and start unchanged and none of them cut by
the attempt's end now, laying goes on from there, to the same timeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

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


AttemptShape = tuple[str, int, int, str | None, int | None, int]
"""What laying read of an attempt laid whole: id, start, end, status, detected, spans."""


@dataclass(frozen=True, slots=True)
class Laid:
    """Where laying stood inside attempt `attempt` (in the window's order), after its first
    `spans` spans, none of which its end cut: the timeline so far and the mark."""

    submit: int
    before: tuple[AttemptShape, ...]  # the attempts laid whole before it
    attempt: int
    attempt_id: str
    attempt_start: int
    spans: int
    reach: int  # the latest start or end of those spans: an end before it would cut one
    t: int  # where the last of them ended (the attempt's start without any)
    hwm: int
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    labels: tuple[str, ...]
    last_progress: tuple[tuple[str, int], ...]  # of the attempts before

    def fits(self, window: JobWindow, attempts: Sequence[ClosedAttempt]) -> bool:
        """Whether laying `attempts` would reach this point the same way (the caller
        knows that the attempt's first `spans` spans are the ones laid: `touched`)."""
        i = self.attempt
        if self.submit != window.submit or i >= len(attempts):
            return False
        a = attempts[i]
        return (a.id == self.attempt_id and a.start == self.attempt_start
                and len(a.spans) >= self.spans and self.reach <= a.end
                and tuple(shape(b) for b in attempts[:i]) == self.before)


def shape(a: ClosedAttempt) -> AttemptShape:
    return (a.id, a.start, a.end, a.status, a.detected, len(a.spans))


@dataclass(frozen=True, slots=True)
class Implied:
    timeline: Timeline
    last_progress: Mapping[str, int]  # attempt id -> end of its last progress (if it made any)
    laid: Laid | None = None  # with `keep`: where the last attempt's uncut spans end


def implied_timeline(window: JobWindow, attempts: Sequence[ClosedAttempt],
                     resume: Laid | None = None, *, keep: bool = False) -> Implied:
    """The implied timeline; `resume` (which must `fit`) skips what it holds, `keep` says
    where the last attempt's uncut spans end (see the module docstring)."""
    base = Timeline()
    last_progress: dict[str, int] = {}
    hwm = _NO_MARK
    first = 0
    if resume is not None:
        base = Timeline(list(resume.starts), list(resume.ends), list(resume.labels))
        last_progress = dict(resume.last_progress)
        hwm, first = resume.hwm, resume.attempt
    add = base.add
    laid = None
    t_prev = window.submit if first == 0 else attempts[first - 1].end
    for i in range(first, len(attempts)):
        a = attempts[i]
        if resume is not None and i == first:
            t, k = resume.t, resume.spans
        else:
            add(t_prev, a.start, "queued" if i == 0 else "rescheduling")
            t, k = a.start, 0
        if keep and i == len(attempts) - 1:
            laid, t, hwm = _keep(base, window, attempts, i, k, t, hwm, resume, last_progress)
        else:
            t, hwm = _lay_steps(add, a.spans if k == 0 else a.spans[k:], t, a.end, hwm,
                                "loop_gap" if k else "startup_other")
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
    return Implied(base, last_progress, laid)


def _keep(base: Timeline, window: JobWindow, attempts: Sequence[ClosedAttempt], i: int,
          k: int, t: int, hwm: int, resume: Laid | None,
          last_progress: dict[str, int]) -> tuple[Laid, int, int]:
    """Lay the last attempt's spans from its `k`-th, noting where its uncut ones end."""
    a = attempts[i]
    spans, end = a.spans, a.end
    reach = resume.reach if resume is not None and resume.attempt == i else a.start
    uncut = spans[k:]
    if uncut and (uncut[-1][0] > end or max(map(itemgetter(1), uncut)) > end):
        # Sorted by start, so the last starts latest; a span cut by the end (a clock
        # ahead of `now`) and all after it are laid below, after the point kept.
        cut = next(n for n, s in enumerate(uncut) if s[0] > end or s[1] > end)
        uncut = uncut[:cut]
    j = k + len(uncut)
    if uncut:
        reach = max(reach, uncut[-1][0], max(map(itemgetter(1), uncut)))
    t, hwm = _lay_steps(base.add, uncut, t, end, hwm, "loop_gap" if k else "startup_other")
    laid = Laid(submit=window.submit, before=tuple(shape(b) for b in attempts[:i]), attempt=i,
                attempt_id=a.id, attempt_start=a.start, spans=j, reach=reach, t=t, hwm=hwm,
                starts=tuple(base.starts), ends=tuple(base.ends), labels=tuple(base.labels),
                last_progress=tuple(last_progress.items()))
    if j < len(spans):
        t, hwm = _lay_steps(base.add, spans[j:], t, end, hwm, "loop_gap" if j else "startup_other")
    return laid, t, hwm


def _lay_steps(add: Callable[[int, int, str], None], spans: Sequence[Span], start: int,
               end: int, hwm: int, gap: str = "startup_other") -> tuple[int, int]:
    """Lay one attempt's spans (clipped to `[start, end]`, in order, each from where the
    previous one ended) and the gaps before them (`gap` before the first: its start-up,
    unless spans were laid before them). Returns the end of the last span (or `start`)
    and the high-water mark after them."""
    t = start
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
