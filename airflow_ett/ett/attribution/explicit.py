"""Stage 5, explicit phases: what trainers, operators and listeners reported, as intervals.

Guarantees: each `phase_started` is paired with the next `phase_ended` of the same
(attempt, phase, span), innermost first, and takes the start's component; a start never
ended runs to its attempt's end (or the job's); an end without a start is dropped with a
warning. Every interval is clipped to its attempt (the job's window without one), and a
checkpoint save adds its blocking time (`checkpoint_save_blocking`, or `final_checkpoint`),
unless the producer reported that phase itself around it (the reference trainer reports
`checkpoint_save_blocking` as the save starts, so that a save in progress can be seen, and
`final_checkpoint` around the last save): a save reported both ways counts once, in
`raw_us` too. `raw_us` keeps each label's clipped duration with overlaps counted in full.
A foreign phase name declared under two components stays two labels (`name@component`), so neither
declaration overrides the other, whatever order the events came in. Nothing here decides
overlaps: that is `precedence`.

Phases of ranks other than 0 are paired the same way, per rank, and clipped to attempts
rank 0's side knows (one naming an attempt nothing else names is dropped, with a
warning); they are kept apart (`rank_intervals`, each with its rank) and do not count in
`raw_us`, which stays rank 0's (a two-rank job would otherwise double every phase).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.attempts import ClosedAttempt
from airflow_ett.ett.attribution.collect import Collected
from airflow_ett.ett.attribution.window import JobWindow
from airflow_ett.ett.events import CheckpointSaved, PhaseEnded, PhaseStarted
from airflow_ett.ett.phases import PHASES, component_of
from airflow_ett.ett.timeline import to_us

Interval = tuple[int, int, str]
"""Start, end (microseconds), label."""


RankInterval = tuple[int, int, int, str]
"""Rank, start, end (microseconds), label."""


@dataclass(frozen=True, slots=True)
class ExplicitPhases:
    intervals: tuple[Interval, ...]  # rank 0's: clipped, non-empty; may overlap
    raw_us: dict[str, int]  # per label, overlaps counted in full (rank 0's)
    label_component: dict[str, str]  # the component of every label reported (any rank)
    warnings: tuple[str, ...]
    rank_intervals: tuple[RankInterval, ...] = ()  # other ranks': clipped, sorted


@dataclass(frozen=True, slots=True)
class _Reported:
    """One paired (or still open) phase, before clipping."""

    attempt: str | None
    start: int
    end: int
    label: str
    component: str


def explicit_phases(collected: Collected, attempts: Sequence[ClosedAttempt],
                    window: JobWindow) -> ExplicitPhases:
    warnings: list[str] = []
    ambiguous = _ambiguous([*collected.phase_marks, *collected.rank_phase_marks])
    if ambiguous:
        warnings.append(f"phase(s) {ambiguous} declared under several components: kept apart "
                        "as name@component")
    reported, unmatched_ends = _pair(collected.phase_marks, ambiguous, window.end)
    if unmatched_ends:
        warnings.append(f"{unmatched_ends} phase_ended event(s) without a start were ignored")
    bounds = {a.id: (a.start, a.end) for a in attempts}
    intervals: list[Interval] = []
    raw: dict[str, int] = {}
    label_component: dict[str, str] = {}
    for r in [*reported, *_blocking(collected.checkpoints, reported)]:
        label_component[r.label] = r.component
        # Every attempt a phase or a save names has its report (collect), so its bounds.
        lo, hi = bounds[r.attempt] if r.attempt is not None else (window.submit, window.end)
        s = min(max(r.start, lo), hi)
        e = min(max(r.end, s), hi)
        raw[r.label] = raw.get(r.label, 0) + (e - s)
        if e > s:
            intervals.append((s, e, r.label))
    rank_intervals = _rank_intervals(collected, ambiguous, bounds, window, label_component,
                                     warnings)
    return ExplicitPhases(tuple(intervals), raw, label_component, tuple(warnings),
                          rank_intervals)


def _rank_intervals(collected: Collected, ambiguous: list[str],
                    bounds: dict[str, tuple[int, int]], window: JobWindow,
                    label_component: dict[str, str], warnings: list[str]
                    ) -> tuple[RankInterval, ...]:
    """The phases of ranks other than 0, paired per rank and clipped like rank 0's."""
    by_rank: dict[int, list[PhaseStarted | PhaseEnded]] = {}
    for mark in collected.rank_phase_marks:
        by_rank.setdefault(mark.rank, []).append(mark)
    out: list[RankInterval] = []
    unknown: set[str] = set()
    unmatched = 0
    for rank, marks in by_rank.items():
        reported, ends = _pair(marks, ambiguous, window.end)
        unmatched += ends
        for r in reported:
            if r.attempt is not None and r.attempt not in bounds:
                unknown.add(r.attempt)
                continue
            label_component.setdefault(r.label, r.component)
            lo, hi = bounds[r.attempt] if r.attempt is not None else (window.submit,
                                                                        window.end)
            s = min(max(r.start, lo), hi)
            e = min(max(r.end, s), hi)
            if e > s:
                out.append((rank, s, e, r.label))
    if unmatched:
        warnings.append(f"{unmatched} phase_ended event(s) of ranks > 0 without a start were "
                        "ignored")
    if unknown:
        warnings.append(f"phases of ranks > 0 name attempt(s) {sorted(unknown)[:5]} that rank "
                        "0 never reported: ignored")
    return tuple(sorted(out))


def _ambiguous(marks: Iterable[PhaseStarted | PhaseEnded]) -> list[str]:
    """Foreign phase names declared under more than one component, sorted."""
    declared: dict[str, set[str]] = {}
    for m in marks:
        if m.phase not in PHASES and m.component is not None:
            declared.setdefault(m.phase, set()).add(m.component)
    return sorted(name for name, comps in declared.items() if len(comps) > 1)


def _pair(marks: Iterable[PhaseStarted | PhaseEnded], ambiguous: list[str],
          job_end: int) -> tuple[list[_Reported], int]:
    """Starts paired with ends (the latest open start first), then the starts still
    open, which run to `job_end` (clipping cuts them at their attempt's end). Also
    returns how many ends had no start."""

    def label_of(phase: str, component: str) -> str:
        return f"{phase}@{component}" if phase in ambiguous else phase

    # Each start remembers its own component: the pair takes the start's declaration.
    open_marks: dict[tuple[str | None, str, str], list[tuple[int, str]]] = {}
    out: list[_Reported] = []
    unmatched_ends = 0
    for mark in sorted(marks, key=lambda m: (m.ts, type(m) is PhaseEnded, m.id)):
        key = (mark.attempt, mark.phase, mark.span)
        if type(mark) is PhaseStarted:
            component = component_of(mark.phase, mark.component)
            open_marks.setdefault(key, []).append((to_us(mark.ts), component))
            continue
        stack = open_marks.get(key)
        if not stack:
            unmatched_ends += 1
            continue
        start, component = stack.pop()
        out.append(_Reported(mark.attempt, start, to_us(mark.ts),
                             label_of(mark.phase, component), component))
    for (attempt, phase, _span), starts in sorted(open_marks.items(), key=lambda kv: str(kv[0])):
        out += [_Reported(attempt, start, job_end, label_of(phase, component), component)
                for start, component in starts]
    return out, unmatched_ends


def _blocking(checkpoints: Iterable[CheckpointSaved],
              reported: Sequence[_Reported]) -> list[_Reported]:
    """The time each checkpoint save blocked the train loop, as a reported phase, unless
    a phase of that label and attempt reported by the producer already holds it."""
    spans: dict[tuple[str | None, str], list[tuple[int, int]]] = {}
    for r in reported:
        if r.label in ("checkpoint_save_blocking", "final_checkpoint"):
            spans.setdefault((r.attempt, r.label), []).append((r.start, r.end))
    held = {key: _Held(sorted(found)) for key, found in spans.items()}
    out = []
    for c in checkpoints:
        s = to_us(c.start_ts)
        e = s + to_us(c.blocking_s)
        label = "final_checkpoint" if c.final else "checkpoint_save_blocking"
        within = held.get((c.attempt, label))
        if within is None or not within.holds(s, e):
            out.append(_Reported(c.attempt, s, e, label, PHASES[label].component))
    return out


class _Held:
    """Reported spans of one label and attempt: does one of them hold [start, end]?"""

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        self.starts = [lo for lo, _ in spans]
        self.reach: list[int] = []  # the furthest end of the spans up to each one
        for _, hi in spans:
            self.reach.append(max(hi, self.reach[-1]) if self.reach else hi)

    def holds(self, start: int, end: int) -> bool:
        """Some span starting at or before `start` ends at or after `end`."""
        i = bisect.bisect_right(self.starts, start)
        return i > 0 and self.reach[i - 1] >= end
