"""Stage 1, collect: one pass over a job's (deduplicated) events, sorted by what reads them.

Guarantees: every event is read once and kept in the form a later stage needs; nothing
here depends on the events' order (where two events speak about the same thing, the
choice is made by time, then id); every attempt any event names gets an `AttemptReport`,
with a start (its `attempt_started`, else its first event) and its progress spans sorted.

Progress events are nearly all of a log: they take the first branch of the loop and
everything else is handed to `_Collector.note`, so this loop is the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    ModelPublished,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.timeline import US_PER_S, to_us

Span = tuple[int, int, int, int]
"""One progress report: start and end (microseconds), cursor start and end."""


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What the events say about one attempt, before the job's window is known."""

    id: str
    start: int  # its earliest attempt_started, else its earliest event
    start_reported: bool  # False: no attempt_started came (a warning, later)
    end: int | None  # the latest attempt_ended (None: no end reported)
    status: str | None  # that end's status: "success" | "failed"
    cause: str | None
    detected: int | None
    exit_code: int | None
    spans: Sequence[Span]  # sorted


@dataclass(frozen=True, slots=True)
class Collected:
    """A job's events, by kind. Tuples in arrival order, except `attempts` (by id)."""

    submitted: tuple[JobSubmitted, ...]
    ended: tuple[JobEnded, ...]
    published: tuple[ModelPublished, ...]
    phase_marks: tuple[PhaseStarted | PhaseEnded, ...]
    checkpoints: tuple[CheckpointSaved, ...]
    attempts: tuple[AttemptReport, ...]
    earliest: int  # the earliest event time: E2E's start when no job_submitted came


@dataclass(slots=True)
class _Attempt:
    """An attempt's report while the events are read (mutable; frozen by `report`)."""

    id: str
    start: int | None = None
    first_seen: int | None = None
    end_key: tuple[int, str] | None = None
    end: AttemptEnded | None = None
    spans: list[Span] = field(default_factory=list)

    def seen(self, t: int) -> None:
        if self.first_seen is None or t < self.first_seen:
            self.first_seen = t

    def ended(self, t: int, e: AttemptEnded) -> None:
        self.seen(t)
        # The latest word on an attempt wins (ties by id, so order never matters).
        if self.end_key is None or (t, e.id) > self.end_key:
            self.end_key = (t, e.id)
            self.end = e

    def report(self) -> AttemptReport:
        self.spans.sort()
        if self.spans:
            self.seen(self.spans[0][0])
        start = self.start if self.start is not None else self.first_seen
        assert start is not None  # every event that names an attempt gives it a time
        e = self.end
        return AttemptReport(
            id=self.id, start=start, start_reported=self.start is not None,
            end=None if self.end_key is None else self.end_key[0],
            status=None if e is None else e.status,
            cause=None if e is None else e.cause,
            detected=None if e is None or e.detected_ts is None else to_us(e.detected_ts),
            exit_code=None if e is None else e.exit_code,
            spans=self.spans,
        )


@dataclass(slots=True)
class _Collector:
    submitted: list[JobSubmitted] = field(default_factory=list)
    ended: list[JobEnded] = field(default_factory=list)
    published: list[ModelPublished] = field(default_factory=list)
    phase_marks: list[PhaseStarted | PhaseEnded] = field(default_factory=list)
    checkpoints: list[CheckpointSaved] = field(default_factory=list)
    attempts: dict[str, _Attempt] = field(default_factory=dict)

    def attempt(self, attempt_id: str) -> _Attempt:
        found = self.attempts.get(attempt_id)
        if found is None:
            found = self.attempts[attempt_id] = _Attempt(attempt_id)
        return found

    def note(self, e: Event, t: int) -> None:
        """Every event but progress, at its time `t` (microseconds)."""
        if isinstance(e, PhaseStarted | PhaseEnded):
            self.phase_marks.append(e)
            if e.attempt is not None:
                self.attempt(e.attempt).seen(t)
        elif isinstance(e, CheckpointSaved):
            self.checkpoints.append(e)
            self.attempt(e.attempt).seen(to_us(e.start_ts))
        elif isinstance(e, AttemptStarted):
            a = self.attempt(e.attempt)
            a.start = t if a.start is None else min(a.start, t)
        elif isinstance(e, AttemptEnded):
            self.attempt(e.attempt).ended(t, e)
        elif isinstance(e, JobSubmitted):
            self.submitted.append(e)
        elif isinstance(e, JobEnded):
            self.ended.append(e)
        elif isinstance(e, ModelPublished):
            self.published.append(e)


def collect(events: list[Event]) -> Collected:
    """Sort one job's events (at least one) by kind; see the module docstring."""
    out = _Collector()
    # The hot loop: progress first (nearly every event is one), names local.
    us = US_PER_S
    rnd = round
    earliest = rnd(events[0].ts * us)
    last_attempt: _Attempt | None = None
    for e in events:
        t = rnd(e.ts * us)
        if t < earliest:
            earliest = t
        if isinstance(e, Progress):
            if last_attempt is None or last_attempt.id != e.attempt:
                last_attempt = out.attempt(e.attempt)
            last_attempt.spans.append((rnd(e.start_ts * us), t, e.cursor_start, e.cursor_end))
        else:
            out.note(e, t)
    return Collected(
        submitted=tuple(out.submitted),
        ended=tuple(out.ended),
        published=tuple(out.published),
        phase_marks=tuple(out.phase_marks),
        checkpoints=tuple(out.checkpoints),
        attempts=tuple(a.report() for _, a in sorted(out.attempts.items())),
        earliest=earliest,
    )
