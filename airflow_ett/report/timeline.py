"""A run's attempt timeline, as the reports and the run page draw it: one row per attempt,
its phases as bars, each failure marked with its cause.

Built from the attribution's final timeline (each microsecond labelled once), so the bars
of a row never overlap and the rows together cover the job's wall time; times are seconds
since the job's submission. Time before the first attempt and between attempts (queueing,
rescheduling) has no attempt: it goes on a row of its own, `scheduling`.

`worst_timelines` draws those of a day's worst runs; their events come from whoever calls
it (`events_of`: the store's `job_events`, in the CLI and the nightly DAG), so this module
reads no store.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from airflow_ett.ett.attribution import AttributionError, JobAttribution, attribute_job
from airflow_ett.ett.timeline import to_s, to_us

if TYPE_CHECKING:
    from airflow_ett.ett.events import Event
    from airflow_ett.rollup import DayRollup

#: The row of the time outside every attempt.
OUTSIDE_ATTEMPTS = "scheduling"
#: How many of the worst runs get a timeline in the HTML report.
TIMELINES: int = 5


class Bar(msgspec.Struct, frozen=True, kw_only=True):
    row: str  # an attempt id, or OUTSIDE_ATTEMPTS
    start_s: float
    end_s: float
    phase: str
    component: str


class FailureMark(msgspec.Struct, frozen=True, kw_only=True):
    attempt: str
    at_s: float
    cause: str


class RunTimeline(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    tenant: str
    model: str
    submitted_at: float
    e2e_s: float
    ett_pct: float
    provisional: bool
    rows: list[str]  # in drawing order: OUTSIDE_ATTEMPTS first (when it has bars), attempts
    bars: list[Bar]
    failures: list[FailureMark]


def run_timeline(attribution: JobAttribution) -> RunTimeline:
    base = to_us(attribution.submitted_at)
    spans = [(to_us(a.start), to_us(a.end), a.attempt) for a in attribution.attempts]

    def row_of(start: int, end: int) -> str:
        for lo, hi, attempt in spans:
            if lo <= start and end <= hi and lo < hi:
                return attempt
        return OUTSIDE_ATTEMPTS

    bars = []
    for start, end, label in attribution.timeline.segments():
        # A segment never crosses an attempt boundary in its middle (attempts bound the
        # implied labels); split it at the boundaries anyway, so a bar is never misplaced.
        cuts = sorted({start, end, *(b for lo, hi, _ in spans for b in (lo, hi)
                                       if start < b < end)})
        for lo, hi in itertools.pairwise(cuts):
            bars.append(Bar(row=row_of(lo, hi), start_s=to_s(lo - base), end_s=to_s(hi - base),
                            phase=label, component=attribution.phase_components[label]))
    attempts = [a.attempt for a in attribution.attempts]
    rows = ([OUTSIDE_ATTEMPTS] if any(b.row == OUTSIDE_ATTEMPTS for b in bars) else []) + attempts
    return RunTimeline(
        job=attribution.job, tenant=attribution.tenant, model=attribution.model,
        submitted_at=attribution.submitted_at, e2e_s=to_s(attribution.e2e_us),
        ett_pct=attribution.ett_pct, provisional=attribution.provisional, rows=rows, bars=bars,
        failures=[FailureMark(attempt=f.attempt, at_s=f.at - attribution.submitted_at,
                              cause=f.cause) for f in attribution.failures],
    )


def worst_timelines(day: DayRollup, events_of: Callable[[str], Sequence[Event]], *,
                    tenant: str | None = None, limit: int = TIMELINES) -> list[RunTimeline]:
    """The attempt timelines of `day`'s worst runs (of `tenant`'s, when given), at most
    `limit`, worst first, each attributed as of the day's computation from `events_of(job)`.
    A run whose events are gone (the store was pruned) has no timeline: it is skipped."""
    out = []
    for run in [r for r in day.top_runs if tenant is None or r.tenant == tenant][:limit]:
        try:
            out.append(run_timeline(attribute_job(events_of(run.job), now=day.computed_at)))
        except AttributionError:
            continue
    return out
