"""Stage 1, collect: one pass over a job's (deduplicated) events, sorted by what reads them.

Guarantees: every event is read once and kept in the form a later stage needs; nothing
here depends on the events' order (where two events speak about the same thing, the
choice is made by time, then id); every attempt any event names gets an `AttemptReport`,
with a start (its `attempt_started`, else its first event) and its progress spans sorted.

Progress events are nearly all of a log: they take the first branch of the loop and
everything else is handed to `_Collector.note`, so this loop is the hot path.

Ranks (docs/decisions/0017-multi-rank.md): rank 0 (and every producer without ranks)
leads. An event of another rank never creates an attempt or moves its start, and its
progress, checkpoints and job-level events are not read (rank 0 alone reports them); its
phases are kept apart (`rank_phase_marks`), and its `attempt_ended` moves the attempt's
end later (an attempt ends when its last rank does) once rank 0's side has ended it,
without changing its status or cause: rank 0's latest word (or the launcher's, sent as
rank 0) is the attempt's.
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
    RankSteps,
)
from airflow_ett.ett.timeline import US_PER_S, to_us

Span = tuple[int, int, int, int, int]
"""One progress report: start and end (microseconds), cursor start and end, steps."""


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
    message: str | None = None  # that end's message (a failure's reason), as sent


@dataclass(frozen=True, slots=True)
class Collected:
    """A job's events, by kind. Tuples in arrival order, except `attempts` (by id)."""

    submitted: tuple[JobSubmitted, ...]
    ended: tuple[JobEnded, ...]
    published: tuple[ModelPublished, ...]
    phase_marks: tuple[PhaseStarted | PhaseEnded, ...]  # rank 0's
    checkpoints: tuple[CheckpointSaved, ...]
    attempts: tuple[AttemptReport, ...]
    earliest: int  # the earliest event time: E2E's start when no job_submitted came
    rank_phase_marks: tuple[PhaseStarted | PhaseEnded, ...] = ()  # of ranks other than 0
    rank_steps: tuple[RankSteps, ...] = ()  # every rank's, rank 0's too (decision 0033)


@dataclass(slots=True)
class _Attempt:
    """An attempt's report while the events are read (mutable; frozen by `report`)."""

    id: str
    start: int | None = None
    first_seen: int | None = None
    end_key: tuple[int, str] | None = None
    end: AttemptEnded | None = None
    spans: list[Span] = field(default_factory=list)
    rank_end: int | None = None  # the latest attempt_ended of a rank other than 0

    def seen(self, t: int) -> None:
        if self.first_seen is None or t < self.first_seen:
            self.first_seen = t

    def ended(self, t: int, e: AttemptEnded) -> None:
        self.seen(t)
        # The latest word on an attempt wins (ties by id, so order never matters).
        if self.end_key is None or (t, e.id) > self.end_key:
            self.end_key = (t, e.id)
            self.end = e

    def report(self, *, sort: bool = True) -> AttemptReport:
        """Frozen; `sort=False` for spans kept sorted already (`live.LiveEvents`)."""
        if sort:
            self.spans.sort()
        if self.spans:
            self.seen(self.spans[0][0])
        start = self.start if self.start is not None else self.first_seen
        assert start is not None  # every event that names an attempt gives it a time
        e = self.end
        end = None if self.end_key is None else self.end_key[0]
        if end is not None and self.rank_end is not None:
            end = max(end, self.rank_end)  # the attempt ends when its last rank does
        return AttemptReport(
            id=self.id, start=start, start_reported=self.start is not None,
            end=end,
            status=None if e is None else e.status,
            cause=None if e is None else e.cause,
            detected=None if e is None or e.detected_ts is None else to_us(e.detected_ts),
            exit_code=None if e is None else e.exit_code,
            spans=self.spans,
            message=None if e is None else e.message,
        )


@dataclass(slots=True)
class _Collector:
    submitted: list[JobSubmitted] = field(default_factory=list)
    ended: list[JobEnded] = field(default_factory=list)
    published: list[ModelPublished] = field(default_factory=list)
    phase_marks: list[PhaseStarted | PhaseEnded] = field(default_factory=list)
    checkpoints: list[CheckpointSaved] = field(default_factory=list)
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    rank_phase_marks: list[PhaseStarted | PhaseEnded] = field(default_factory=list)
    rank_ends: list[tuple[str, int]] = field(default_factory=list)  # (attempt, time)
    rank_steps: list[RankSteps] = field(default_factory=list)

    def attempt(self, attempt_id: str) -> _Attempt:
        found = self.attempts.get(attempt_id)
        if found is None:
            found = self.attempts[attempt_id] = _Attempt(attempt_id)
        return found

    def note_rank(self, e: Event, t: int) -> None:
        """An event of a rank other than 0: its phases and attempt ends are kept aside."""
        if isinstance(e, PhaseStarted | PhaseEnded):
            self.rank_phase_marks.append(e)
        elif isinstance(e, AttemptEnded):
            self.rank_ends.append((e.attempt, t))

    def close_rank_ends(self) -> None:
        """Each attempt rank 0's side knows ends with its last rank's end."""
        for attempt_id, t in self.rank_ends:
            a = self.attempts.get(attempt_id)
            if a is not None and (a.rank_end is None or t > a.rank_end):
                a.rank_end = t

    def collected(self, earliest: int, *, sort_spans: bool = True) -> Collected:
        """What was read, frozen (rank ends closed already)."""
        return Collected(
            submitted=tuple(self.submitted),
            ended=tuple(self.ended),
            published=tuple(self.published),
            phase_marks=tuple(self.phase_marks),
            checkpoints=tuple(self.checkpoints),
            attempts=tuple(a.report(sort=sort_spans) for _, a in sorted(self.attempts.items())),
            earliest=earliest,
            rank_phase_marks=tuple(self.rank_phase_marks),
            rank_steps=tuple(self.rank_steps),
        )

    def note(self, e: Event, t: int) -> None:
        """Every event but progress, at its time `t` (microseconds)."""
        if e.rank:
            self.note_rank(e, t)
        elif isinstance(e, PhaseStarted | PhaseEnded):
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
    first = next((e for e in events if not e.rank), events[0])  # rank 0 leads, if any
    earliest = rnd(first.ts * us)
    last_attempt: _Attempt | None = None
    for e in events:
        t = rnd(e.ts * us)
        if isinstance(e, Progress):
            if e.rank:  # rank 0 alone reports progress
                continue
            if t < earliest:
                earliest = t
            if last_attempt is None or last_attempt.id != e.attempt:
                last_attempt = out.attempt(e.attempt)
            last_attempt.spans.append((rnd(e.start_ts * us), t, e.cursor_start, e.cursor_end,
                                       e.step_end - e.step_start))
        elif isinstance(e, RankSteps):  # every rank's own: never the job's or attempt's bounds
            out.rank_steps.append(e)
        else:
            if t < earliest and not e.rank:
                earliest = t
            out.note(e, t)
    out.close_rank_ends()
    return out.collected(earliest)
