"""Stage 8, Level 1: TTS, each failure's TTR, in-loop waste and shutdown, read off the
same timeline Level 2 sums, so that both levels describe one timeline.

Guarantees (DESIGN section 1; the property tests check them):
`E2E = TTS + sum(TTR_i) + effective + in-loop waste + shutdown`, to the microsecond.
- TTS: submission -> the first effective segment (or the end, if none yet).
- A failure's anchor is its attempt's last progress (its start if it made none). Before
  the first effective step it is part of TTS (`during_tts`, no TTR); after it, TTR runs
  from the anchor to the next effective segment, or the next failure's anchor (recoveries
  never overlap), or the end, and is split into `TTR_STAGES`.
- Shutdown: the last effective segment -> the end, unless the job still runs or a
  recovery starts after that segment (the time is then the recovery's).
- In-loop waste: everything after the first effective step that is neither effective nor
  inside a recovery or the shutdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.attempts import ClosedAttempt
from airflow_ett.ett.attribution.implied import EFFECTIVE_LABEL
from airflow_ett.ett.attribution.result import FailureSummary
from airflow_ett.ett.attribution.window import JobWindow
from airflow_ett.ett.phases import TTR_STAGES, ttr_stage
from airflow_ett.ett.timeline import Timeline, to_s

Window = tuple[int, int]
"""`[lo, hi)` in microseconds."""


@dataclass(frozen=True, slots=True)
class Level1:
    tts_us: int
    tts_phases_us: dict[str, int]
    failures: tuple[FailureSummary, ...]
    in_loop_waste_us: int
    shutdown_us: int


def level1(timeline: Timeline, window: JobWindow, attempts: Sequence[ClosedAttempt],
           last_progress: Mapping[str, int], phase_components: Mapping[str, str]) -> Level1:
    first_eff = timeline.first_start(EFFECTIVE_LABEL)
    failures, recoveries = _failures(timeline, window.end, first_eff, attempts, last_progress,
                                     phase_components)
    shutdown = _shutdown(timeline, window, recoveries)
    tts_end = window.end if first_eff is None else first_eff
    in_loop = 0
    if first_eff is not None:
        claimed = sorted(recoveries + ([shutdown] if shutdown else []))
        in_loop = _in_loop_waste(timeline, first_eff, claimed, window.end)
    return Level1(
        tts_us=tts_end - window.submit,
        tts_phases_us=timeline.totals(window.submit, tts_end),
        failures=tuple(failures),
        in_loop_waste_us=in_loop,
        shutdown_us=0 if shutdown is None else shutdown[1] - shutdown[0],
    )


def _failures(timeline: Timeline, end: int, first_eff: int | None,
              attempts: Sequence[ClosedAttempt], last_progress: Mapping[str, int],
              phase_components: Mapping[str, str]) -> tuple[list[FailureSummary], list[Window]]:
    """Every failure in attempt order, and the recovery window of those after TTS."""
    failed = [a for a in attempts if a.status == "failed"]
    anchors = [last_progress.get(a.id, a.start) for a in failed]
    failures: list[FailureSummary] = []
    recoveries: list[Window] = []
    for i, a in enumerate(failed):
        anchor = anchors[i]
        assert a.cause is not None
        if first_eff is None or anchor < first_eff:
            failures.append(FailureSummary(a.id, a.cause, to_s(anchor), True, None, 0, {}, {}))
            continue
        # stop >= anchor: the next effective time is at or after it, and closed attempts
        # never overlap, so the next failure's anchor is not before this one either.
        stop = end
        next_eff = timeline.first_start(EFFECTIVE_LABEL, anchor)
        if next_eff is not None:
            stop = min(stop, next_eff)
        if i + 1 < len(failed):
            stop = min(stop, anchors[i + 1])
        recoveries.append((anchor, stop))
        failures.append(_recovery(timeline, a.id, a.cause, anchor, stop, phase_components))
    return failures, recoveries


def _recovery(timeline: Timeline, attempt: str, cause: str, anchor: int, stop: int,
              phase_components: Mapping[str, str]) -> FailureSummary:
    inside = timeline.totals(anchor, stop)
    stages = dict.fromkeys(TTR_STAGES, 0)
    for label, us in inside.items():
        stages[ttr_stage(label, phase_components[label])] += us
    return FailureSummary(attempt, cause, to_s(anchor), False, stop - anchor,
                          inside.get("detection", 0), stages, inside)


def _shutdown(timeline: Timeline, window: JobWindow, recoveries: list[Window]) -> Window | None:
    # While the job runs, time after its last step is still in the loop, not shutdown.
    last_eff_end = _last_end(timeline, EFFECTIVE_LABEL)
    if (window.provisional or last_eff_end is None
            or any(lo >= last_eff_end for lo, _ in recoveries)):
        return None
    return last_eff_end, window.end


def _in_loop_waste(timeline: Timeline, first_eff: int, claimed: list[Window], end: int) -> int:
    """Non-effective time from `first_eff` to `end` outside the `claimed` windows."""
    waste = 0
    cursor = first_eff
    for lo, hi in [*claimed, (end, end)]:
        if lo > cursor:
            gap = timeline.totals(cursor, lo)
            waste += sum(gap.values()) - gap.get(EFFECTIVE_LABEL, 0)
        cursor = max(cursor, hi)
    return waste


def _last_end(timeline: Timeline, label: str) -> int | None:
    for i in range(len(timeline) - 1, -1, -1):
        if timeline.labels[i] == label:
            return timeline.ends[i]
    return None
