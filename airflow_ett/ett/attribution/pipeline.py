"""The attribution entry points, and the one function that runs the stages in order.

Guarantees: events are deduplicated by id first (see `dedupe`), so replaying an event
changes nothing; the result depends on the set of events, never on their order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from airflow_ett.ett.attribution.assemble import assemble
from airflow_ett.ett.attribution.attempts import ClosedAttempt, close_attempts
from airflow_ett.ett.attribution.collect import Collected, collect
from airflow_ett.ett.attribution.explicit import explicit_phases
from airflow_ett.ett.attribution.implied import Implied, implied_timeline
from airflow_ett.ett.attribution.level1 import level1
from airflow_ett.ett.attribution.level2 import level2
from airflow_ett.ett.attribution.precedence import overlay
from airflow_ett.ett.attribution.result import AttributionError, JobAttribution
from airflow_ett.ett.attribution.slow_steps import SlowSteps, slow_steps
from airflow_ett.ett.attribution.stragglers import RankStepTimes, rank_step_times
from airflow_ett.ett.attribution.window import JobWindow, job_window
from airflow_ett.ett.events import Event, event_to_json
from airflow_ett.ett.timeline import Timeline


def dedupe(events: Iterable[Event]) -> tuple[list[Event], int]:
    """One event per id. Two different events under one id are a producer bug; keep the
    one with the smaller JSON form so that the outcome does not depend on arrival order.
    The count is of ids that came with more than one content, as the store counts them."""
    unique, conflicted = _dedupe(events)
    return unique, len({i for ids in conflicted.values() for i in ids})


def _dedupe(events: Iterable[Event]) -> tuple[list[Event], dict[str, set[str]]]:
    """`dedupe`, with the conflicting ids by job: each job warns only of its own ids (an
    id reused across jobs is every such job's problem)."""
    given = events if isinstance(events, list) else list(events)
    by_id = {event.id: event for event in given}
    conflicted: dict[str, set[str]] = {}
    if len(by_id) == len(given):  # the common case: no id seen twice
        return given, conflicted
    for event in given:
        kept = by_id[event.id]
        if kept is not event and kept != event:
            conflicted.setdefault(event.job, set()).add(event.id)
            conflicted.setdefault(kept.job, set()).add(event.id)
            if event_to_json(event) < event_to_json(kept):
                by_id[event.id] = event
    return list(by_id.values()), conflicted


def attribute(events: Iterable[Event], now: float | None = None) -> dict[str, JobAttribution]:
    """Attribute every job found in `events`; keys are job ids, sorted."""
    unique, conflicted = _dedupe(events)
    by_job: dict[str, list[Event]] = {}
    for event in unique:
        by_job.setdefault(event.job, []).append(event)
    return {
        job: _attribute_unique(job, by_job[job], now, conflicts=len(conflicted.get(job, ())))
        for job in sorted(by_job)
    }


def attribute_job(events: Iterable[Event], now: float | None = None) -> JobAttribution:
    """Attribute the one job `events` describe."""
    unique, conflicted = _dedupe(events)
    jobs = sorted({e.job for e in unique})
    if not jobs:
        raise AttributionError("no events: nothing to attribute")
    if len(jobs) > 1:
        raise AttributionError(f"events of {len(jobs)} jobs given, expected one: {jobs[:5]}")
    return _attribute_unique(jobs[0], unique, now, conflicts=len(conflicted.get(jobs[0], ())))


class Stages:
    """The stages whose work grows with the job's progress, as one pass computes them;
    `incremental.IncrementalAttribution` resumes them where its last pass stopped."""

    def implied(self, window: JobWindow, attempts: Sequence[ClosedAttempt]) -> Implied:
        return implied_timeline(window, attempts)

    def slow(self, attempts: Sequence[ClosedAttempt], timeline: Timeline,
             phase_components: Mapping[str, str]) -> SlowSteps | None:
        return slow_steps(attempts, timeline, phase_components)

    def ranks(self, collected: Collected) -> RankStepTimes | None:
        return rank_step_times(collected.rank_steps)


_ONE_PASS = Stages()


def _attribute_unique(job: str, events: list[Event], now: float | None, *,
                      conflicts: int) -> JobAttribution:
    """One job's events (unique ids, at least one) through the stages, in order."""
    return attribute_collected(job, collect(events), now, conflicts=conflicts)


def attribute_collected(job: str, collected: Collected, now: float | None, *,
                        conflicts: int = 0, stages: Stages = _ONE_PASS) -> JobAttribution:
    """The stages after `collect`, in order (`stages`: how the growing ones are run)."""
    window = job_window(collected, now)
    closed = close_attempts(window)
    implied = stages.implied(window, closed.attempts)
    explicit = explicit_phases(collected, closed.attempts, window)
    timeline = overlay(implied.timeline, explicit)
    l2 = level2(timeline, explicit)
    l1 = level1(timeline, window, closed.attempts, implied.last_progress, l2.phase_components)
    slow = stages.slow(closed.attempts, timeline, l2.phase_components)
    warnings = [f"{conflicts} event id(s) reused with different content"] if conflicts else []
    warnings += [*window.warnings, *closed.warnings, *explicit.warnings]
    return assemble(job, collected=collected, window=window, attempts=closed.attempts,
                    explicit=explicit, timeline=timeline, l2=l2, l1=l1, warnings=warnings,
                    slow=slow, ranks=stages.ranks(collected))
