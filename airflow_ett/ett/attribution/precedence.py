"""Stage 6, precedence: the explicit phases laid over the implied timeline, so that every
moment has exactly one label. docs/decisions/0002-attribution-precedence.md says why the
order is this one; this module is the one place that decides it.

Highest first:
1. explicit `wasted_training` phases (checkpoint blocking, data waits, stalls);
2. explicit `compilation` phases (a recompile inside a step is the compiler's);
3. progress: `effective_steps` and `replay` (the implied timeline's, never replaced here);
4. explicit `initialization`, then `shutdown`, then `scheduling` phases;
5. the implied labels, which any explicit phase of 4 replaces.
Among overlapping phases of one component the innermost (latest start) wins, ties by the
phase registry's order. Guarantee: the result covers exactly what the implied timeline
covers (explicit time outside it is dropped), still without gaps or overlaps.

Rank 0 leads: all of the above is its phases (and the producers without ranks). Phases of
other ranks come last, and only where the timeline still has an implied label: where
rank 0 shows nothing (a rank still initialising while rank 0 waits for it). They never
replace rank 0's phases or progress (docs/decisions/0017-multi-rank.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_ett.ett.attribution.explicit import ExplicitPhases, Interval
from airflow_ett.ett.attribution.implied import IMPLIED_LABELS
from airflow_ett.ett.phases import (
    COMPILATION,
    COMPONENT_ORDER,
    INITIALIZATION,
    PHASE_ORDER,
    SCHEDULING,
    SHUTDOWN,
    WASTED,
)
from airflow_ett.ett.timeline import Timeline, paint, resolve_overlaps

ABOVE_PROGRESS = (WASTED, COMPILATION)
BELOW_PROGRESS = (INITIALIZATION, SHUTDOWN, SCHEDULING)


def overlay(implied: Timeline, explicit: ExplicitPhases) -> Timeline:
    components = explicit.label_component
    above = [iv for iv in explicit.intervals if components[iv[2]] in ABOVE_PROGRESS]
    below = [iv for iv in explicit.intervals if components[iv[2]] in BELOW_PROGRESS]
    timeline = paint(implied, _flatten(above, components, ABOVE_PROGRESS), lambda _: True)
    timeline = paint(timeline, _flatten(below, components, BELOW_PROGRESS),
                     IMPLIED_LABELS.__contains__)
    if not explicit.rank_intervals:
        return timeline
    others = [(s, e, label) for _rank, s, e, label in explicit.rank_intervals]
    return paint(timeline, _flatten(others, components, ABOVE_PROGRESS + BELOW_PROGRESS),
                 IMPLIED_LABELS.__contains__)


def _flatten(intervals: list[Interval], label_component: Mapping[str, str],
             precedence: Sequence[str]) -> Timeline:
    order = {component: i for i, component in enumerate(precedence)}
    return resolve_overlaps(
        intervals,
        rank=lambda label: order[label_component[label]],
        tie=lambda label: PHASE_ORDER.get(label, len(PHASE_ORDER) + COMPONENT_ORDER[
            label_component[label]]),
    )
