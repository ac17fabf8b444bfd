"""One job's attribution kept up to date as its events arrive: a running job attributed
again and again (the run page asks every 10 s) at the cost of what arrived since, not of
the whole job (decision 0034).

`IncrementalAttribution.attribute(now)` returns exactly what `attribute_job(events,
now)` returns for all the events added, listed in the store's order (their keys; see
`live`): the same stages, over the same data, those that read every event resumed
instead of run from the start. What grows with the job's length is its progress (one
span a second) and, with ranks, their step reports (decision 0033), and four things read
all of it:

1. `collect`: `live.LiveEvents` keeps what it reads, per event as it arrives.
2. the implied timeline's spans (`implied._lay_steps`): the last pass kept where laying
   the last attempt's spans stood (`implied.Laid`) before the first span its end cut (a
   running attempt ends at `now`, so every span is uncut until a clock is ahead); the
   next pass resumes there when that point still `fits` (same start, same attempts laid
   whole before it, no span landed before it, none of its spans cut by the end now).
3. slow steps (`slow_steps.measure`, then `slow_steps.Finish`): measuring resumes at the
   same point, over the measure kept (its lists and per-step totals grown in place),
   when the final timeline (explicit phases laid over the implied one) labels the same
   time effective before that point as it did, which is all a span's measure reads: a
   save's blocking time reported late between spans leaves it, a phase reported late
   over spans already measured changes it, and the spans are measured again.
4. rank step times (`stragglers`): `live_ranks.LiveRankSteps` keeps them up to date per
   report.

Everything else (the window, closing the attempts, explicit phases, precedence, both
levels, the result) is computed in full each time: its cost is the number of attempts,
phases and saves and of the final timeline's segments, not of the spans (back-to-back
spans merge into one segment). A finished job's result is kept until an event comes.

Any doubt is settled by starting from nothing: a state that does not fit is dropped and
the pass runs from the start (the cost of one full attribution), keeping a new state.
tests/ett/test_incremental.py compares it with `attribute_job` on generated streams,
fed in batches, late events and all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.attempts import ClosedAttempt
from airflow_ett.ett.attribution.collect import Collected
from airflow_ett.ett.attribution.implied import Implied, Laid, implied_timeline
from airflow_ett.ett.attribution.live import LiveEvents
from airflow_ett.ett.attribution.live_ranks import Key
from airflow_ett.ett.attribution.pipeline import Stages, attribute_collected
from airflow_ett.ett.attribution.result import AttributionError, JobAttribution
from airflow_ett.ett.attribution.slow_steps import (
    Finish,
    Mark,
    SlowSteps,
    _Measured,
    effective_labels,
    measure,
)
from airflow_ett.ett.attribution.stragglers import RankStepTimes
from airflow_ett.ett.attribution.window import JobWindow
from airflow_ett.ett.events import Event, ModelPublished
from airflow_ett.ett.timeline import Timeline

Effective = tuple[tuple[int, int], ...]
"""The time a timeline labels effective training before a moment, as merged intervals."""


def _effective(timeline: Timeline, labels: frozenset[str], before: int) -> Effective:
    """What a span's measure reads of the timeline (`slow_steps._measure`: the effective
    time inside it), for the spans before `before`."""
    out: list[tuple[int, int]] = []
    for start, end, label in timeline.segments():
        if start >= before:
            break
        if label not in labels:
            continue
        end = min(end, before)
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)


@dataclass(slots=True)
class _Kept:
    """What the last pass kept: where laying stood, and the slow-step measure up to the
    same point over the effective time the final timeline had before it."""

    laid: Laid
    measured: _Measured
    finish: Finish
    mark: Mark
    effective: Effective


class IncrementalAttribution(Stages):
    """One job's events, added as they arrive, attributed as often as asked (see the
    module docstring). Not thread-safe: one caller at a time (`store.follow` locks)."""

    def __init__(self) -> None:
        self.events = LiveEvents()
        self._kept: _Kept | None = None
        self._fits: _Kept | None = None  # the kept state, when it fits this pass
        self._laid: Laid | None = None  # where this pass's laying stood
        self._final: tuple[int, JobAttribution] | None = None
        self.passes = 0  # passes run; of them, resumed (laying), and measured again:
        self.resumed = 0
        self.measured_again = 0

    def add(self, key: Key, event: Event) -> None:
        self.events.add(key, event)

    def extend(self, keyed: Sequence[tuple[Key, Event]]) -> None:
        self.events.extend(keyed)

    @property
    def count(self) -> int:
        return self.events.count

    def published(self) -> list[ModelPublished]:
        return self.events.published()

    def attribute(self, now: float | None = None) -> JobAttribution:
        """`attribute_job(events in key order, now)` (see the module docstring)."""
        live = self.events
        if self._final is not None and self._final[0] == live.count:
            return self._final[1]  # a finished job: nothing moves without an event
        jobs = sorted(live.jobs)
        if not jobs:
            raise AttributionError("no events: nothing to attribute")
        if len(jobs) > 1:
            raise AttributionError(f"events of {len(jobs)} jobs given, expected one: "
                                   f"{jobs[:5]}")
        self.passes += 1
        try:
            result = attribute_collected(jobs[0], live.collected(), now, stages=self)
        except BaseException:
            self._kept = None  # whatever it kept may be half done
            raise
        finally:
            self._fits = self._laid = None
            live.settle()
        self._final = None if result.provisional else (live.count, result)
        return result

    # -- the stages, resumed --------------------------------------------------------------

    def implied(self, window: JobWindow, attempts: Sequence[ClosedAttempt]) -> Implied:
        kept = self._kept
        if kept is not None and not self._still_fits(kept.laid, window, attempts):
            kept = self._kept = None
        self._fits = kept
        found = implied_timeline(window, attempts, None if kept is None else kept.laid,
                                 keep=True)
        self._laid = found.laid
        if kept is not None:
            self.resumed += 1
        return found

    def _still_fits(self, laid: Laid, window: JobWindow,
                    attempts: Sequence[ClosedAttempt]) -> bool:
        if not laid.fits(window, attempts):
            return False
        touched = self.events.touched
        # No span landed among those laid, in its attempt or (`fits`: their counts) before.
        return touched.get(laid.attempt_id, laid.spans) >= laid.spans

    def slow(self, attempts: Sequence[ClosedAttempt], timeline: Timeline,
             phase_components: Mapping[str, str]) -> SlowSteps | None:
        effective = effective_labels(phase_components)
        kept, laid = self._fits, self._laid
        if kept is not None and _effective(timeline, effective, kept.laid.t) != kept.effective:
            kept = None  # effective time changed under spans measured: measure them again
            self.measured_again += 1
        if kept is None:
            measured = _Measured.empty()
            kept_finish, mark = Finish(measured), Mark()
        else:
            measured, kept_finish, mark = kept.measured, kept.finish, kept.mark
        if laid is None:  # no attempt: nothing measured, nothing kept
            self._kept = None
            return kept_finish.of(measured)
        mark = measure(measured, attempts, timeline, effective, mark,
                       until=(laid.attempt, laid.spans))
        self._kept = _Kept(laid, measured, kept_finish, mark,
                           _effective(timeline, effective, laid.t))
        if laid.spans == len(attempts[laid.attempt].spans):
            return kept_finish.of(measured)
        tail = measured.copy()  # spans past the point kept (cut by the end): not kept
        measure(tail, attempts, timeline, effective, mark)
        return kept_finish.of(tail)

    def ranks(self, collected: Collected) -> RankStepTimes | None:
        return self.events.ranks.times()
