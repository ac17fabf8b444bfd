"""A trainer's events as trace spans: each attempt, its phases, its checkpoint saves, its
first effective step, the replay and the detection of a failure (docs/tracing.md).

Which span a moment belongs to is a decision about events, like the attribution, so it
is made here, purely (no OpenTelemetry, no I/O); `emit/tracing.py` turns what `SpanBuilder`
says into OpenTelemetry spans. The builder reads the events of one reporter (rank 0 of an
attempt: events of other ranks are ignored) in the order they were recorded, and answers
each with what to do now: `Opened` (an attempt began: its span starts and stays open),
`Finished` (a span whose two ends are known), `Closed` (an attempt's span ends).

The spans are the breakdown's, by construction:
- Times are the attribution's integer microseconds (`timeline.to_us`).
- Phases are paired as `attribution.explicit` pairs them (the latest open start of the
  same attempt, phase and span), clipped to their attempt; a phase still open when its
  attempt ends runs to that end; a checkpoint save adds its blocking time as a phase
  (`checkpoint_save_blocking`, or `final_checkpoint`) unless a reported phase of that label
  and attempt holds it. So the phase spans of one label last, together, exactly what
  `JobSummary.phases_raw` counts for it.
- The first effective step starts where `attribution.implied` starts the effective time:
  in the first progress whose cursor passes the job's high-water mark (the largest
  cursor of any earlier progress), cut in proportion to the cursor when the progress
  straddles the mark. The mark left by earlier attempts (other processes) is the
  caller's to give (`high_water`, `know_high_water`); where it is not known, no first
  effective step is marked. The attribution lays waste and compilation phases over steps
  (decision 0002): where one overlaps the first effective step, TTS ends at that phase's
  end, while this span stays where the progress puts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.phases import component_of
from airflow_ett.ett.timeline import to_us

AttrValue = str | int | float | bool
Attributes = dict[str, AttrValue]

ATTEMPT_SPAN: Final = "ett.attempt"
PHASE_SPAN_PREFIX: Final = "ett.phase."
SAVE_SPAN: Final = "ett.checkpoint_save"
FIRST_EFFECTIVE_SPAN: Final = "ett.first_effective_step"
REPLAY_SPAN: Final = "ett.replay"
DETECTION_SPAN: Final = "ett.detection"
FAILURE_NOTE: Final = "ett.failure"

#: The labels a checkpoint save's blocking time takes (`attribution.explicit._blocking`).
_BLOCKING: Final = ("checkpoint_save_blocking", "final_checkpoint")
#: Below every cursor the event format allows: "no high-water mark yet".
_NO_MARK: Final = -(2**63) - 1
#: Reported save phases remembered per attempt and label, to judge later saves by: a
#: save is judged against the phases around its start, which are the last few.
_HELD_KEPT: Final = 64
#: Phases open at once, at most: a producer that starts phases and never ends them must
#: not grow this process without bound (its later starts get no span).
MAX_OPEN_PHASES: Final = 4096


@dataclass(frozen=True, slots=True)
class Note:
    """A moment on a span (an OpenTelemetry span event)."""

    name: str
    at_us: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class Opened:
    """Attempt `attempt` began at `start_us`: its span starts, and stays open until
    `Closed` (its children name it as their parent)."""

    attempt: str
    start_us: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class Finished:
    """A whole span. `attempt`: its parent attempt's span (None: the trace's parent, for
    a phase no attempt owns)."""

    name: str
    attempt: str | None
    start_us: int
    end_us: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class Closed:
    """Attempt `attempt` ended at `end_us`; `error`, for a failed one, is its status
    description."""

    attempt: str
    end_us: int
    attributes: Attributes
    notes: tuple[Note, ...]
    error: str | None


SpanAction = Opened | Finished | Closed


@dataclass(slots=True)
class _Attempt:
    """What the builder knows of one open attempt."""

    id: str
    start: int
    last_end: int  # the end of its last progress (its start before any): where steps go on
    progressed: bool = False
    decided: bool = False  # its first effective step found, or not to be looked for
    replay_from: int | None = None
    host: str | None = None
    #: reported save phases (unclipped start, end), per label: the saves they hold
    held: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: saves whose blocking time waits for an open phase of its label to end
    pending: list[tuple[int, int, str]] = field(default_factory=list)


class SpanBuilder:
    """One reporter's events in, the spans to make out (see the module docstring).

    `high_water`: the job's cursor high-water mark before the first event given (None:
    no progress yet); with `high_water_known=False` it is not known yet:
    `know_high_water` must give it before the first progress, or no first effective
    step is marked. `attempt_attributes` go on every attempt's span.
    """

    def __init__(self, job: str, *, high_water: int | None = None,
                 high_water_known: bool = True,
                 attempt_attributes: Mapping[str, AttrValue] | None = None) -> None:
        self.job = job
        self._hwm = _NO_MARK if high_water is None else high_water
        self._known = high_water_known
        self._extra: Attributes = dict(attempt_attributes or {})
        self._attempts: dict[str, _Attempt] = {}
        self._closed: set[str] = set()
        # (attempt, phase, span) -> starts still open: (time, component), latest last
        self._open: dict[tuple[str | None, str, str], list[tuple[int, str]]] = {}
        self._open_count = 0
        self._hwm_lost = False  # the mark could not be had: no first effective step

    @property
    def needs_high_water(self) -> bool:
        """Whether the caller still owes the high-water mark (`know_high_water`)."""
        return not self._known

    def know_high_water(self, value: int | None, *, known: bool = True) -> None:
        """The job's high-water mark before this reporter's progress (None: none); with
        `known=False`, it cannot be had: no first effective step is marked."""
        if value is not None:
            self._hwm = max(self._hwm, value)
        self._known = True
        if not known:
            self._hwm_lost = True
            for a in self._attempts.values():
                a.decided = True

    # -- events ------------------------------------------------------------------------

    def add(self, event: Event) -> list[SpanAction]:
        """What `event` (the next one recorded) makes of the spans."""
        if event.rank:
            return []
        if isinstance(event, Progress):
            return self._progress(event)
        if isinstance(event, PhaseStarted | PhaseEnded):
            return self._phase(event)
        if isinstance(event, CheckpointSaved):
            return self._save(event)
        if isinstance(event, AttemptStarted):
            a, out = self._attempt(event.attempt, to_us(event.ts))
            if a is not None and event.host:
                a.host = event.host
            return out
        if isinstance(event, AttemptEnded):
            return self._ended(event)
        return []

    def finish(self, now_us: int) -> list[SpanAction]:
        """Close what is still open at `now_us` (the reporter stops): its attempts, as
        not reported, and the phases no attempt owns."""
        out: list[SpanAction] = []
        for attempt in list(self._attempts):
            out += self._close(attempt, now_us, None)
        for (owner, phase, _span), starts in self._open.items():
            out += [self._phase_span(owner, phase, component, start, max(start, now_us))
                    for start, component in starts]
        self._open.clear()
        self._open_count = 0
        return out

    # -- attempts ----------------------------------------------------------------------

    def _attempt(self, attempt: str, at: int) -> tuple[_Attempt | None, list[SpanAction]]:
        """The open attempt `attempt`, opened at `at` by its first event; None once it
        has closed (what comes after its end is not its span's any more)."""
        found = self._attempts.get(attempt)
        if found is not None:
            return found, []
        if attempt in self._closed:
            return None, []
        found = self._attempts[attempt] = _Attempt(attempt, at, at, decided=self._hwm_lost)
        attrs: Attributes = {"ett.job": self.job, "ett.attempt": attempt, **self._extra}
        return found, [Opened(attempt, at, attrs)]

    def _ended(self, e: AttemptEnded) -> list[SpanAction]:
        a, out = self._attempt(e.attempt, to_us(e.ts))
        if a is None:
            return out
        return out + self._close(e.attempt, to_us(e.ts), e)

    def _close(self, attempt: str, at: int, e: AttemptEnded | None) -> list[SpanAction]:
        """Attempt `attempt` ends at `at`: its open phases and waiting saves first, then
        its replay (when no effective step followed), its detection, its own span."""
        a = self._attempts.pop(attempt)
        self._closed.add(attempt)
        end = max(at, a.start)
        out: list[SpanAction] = []
        for key in [k for k in self._open if k[0] == attempt]:
            for start, component in self._open.pop(key):
                self._open_count -= 1
                self._held(a, key[1], start, end)
                out.append(self._phase_span(attempt, key[1], component, start, end, a, end))
        for s, blocking_end, label in a.pending:
            if not _holds(a.held.get(label, ()), s, blocking_end):
                out.append(self._phase_span(attempt, label, "", s, blocking_end, a, end))
        if not a.decided and a.replay_from is not None:
            out.append(self._replay(a, a.last_end))
        attrs: Attributes = {}
        if a.host:
            attrs["ett.host"] = a.host
        notes: list[Note] = []
        error = None
        if e is None:
            attrs["ett.status"] = "unreported"
        else:
            attrs["ett.status"] = e.status
            if e.exit_code is not None:
                attrs["ett.exit_code"] = e.exit_code
            if e.status == "failed":
                cause = e.cause or "unknown"
                notes.append(self._failure(a, e, end, out))
                attrs["ett.cause"] = cause
                error = f"{cause}: {e.message}" if e.message else cause
        out.append(Closed(attempt, end, attrs, tuple(notes), error))
        return out

    def _failure(self, a: _Attempt, e: AttemptEnded, end: int,
                 out: list[SpanAction]) -> Note:
        """The failure's note, at the moment it was noticed; from the attempt's last
        progress to that moment, its detection (`attribution.implied._lay_ending`)."""
        detected = end if e.detected_ts is None else min(max(to_us(e.detected_ts),
                                                             a.last_end), end)
        if a.progressed and detected > a.last_end:
            out.append(Finished(DETECTION_SPAN, a.id, a.last_end, detected, {
                "ett.job": self.job, "ett.attempt": a.id,
                "ett.component": "wasted_training"}))
        attrs: Attributes = {"ett.cause": e.cause or "unknown"}
        if e.exit_code is not None:
            attrs["ett.exit_code"] = e.exit_code
        if e.message:
            attrs["ett.message"] = e.message
        return Note(FAILURE_NOTE, detected, attrs)

    # -- phases and saves --------------------------------------------------------------

    def _phase(self, e: PhaseStarted | PhaseEnded) -> list[SpanAction]:
        t = to_us(e.ts)
        a: _Attempt | None = None
        out: list[SpanAction] = []
        if e.attempt is not None:
            a, out = self._attempt(e.attempt, t)
            if a is None:
                return out
        key = (e.attempt, e.phase, e.span)
        if isinstance(e, PhaseStarted):
            try:
                component = component_of(e.phase, e.component)
            except KeyError:  # unregistered without a component: the writer refuses it too
                return out
            if self._open_count < MAX_OPEN_PHASES:
                self._open.setdefault(key, []).append((t, component))
                self._open_count += 1
            return out
        starts = self._open.get(key)
        if not starts:
            return out  # an end without a start: the attribution drops it too
        start, component = starts.pop()
        self._open_count -= 1
        if not starts:
            del self._open[key]
        if a is not None:
            self._held(a, e.phase, start, t)
            out += self._settle(a, e.phase)
        out.append(self._phase_span(e.attempt, e.phase, component, start, t, a))
        return out

    def _phase_span(self, attempt: str | None, label: str, component: str, start: int,
                    end: int, a: _Attempt | None = None, hi: int | None = None) -> Finished:
        """A phase's span, clipped as `attribution.explicit` clips it: to its attempt's
        start (and to `hi`, the attempt's end, once known)."""
        s, e = start, end
        if a is not None:
            s = max(s, a.start)
            e = max(e, s)
        if hi is not None:
            s, e = min(s, hi), min(e, hi)
        attrs: Attributes = {"ett.job": self.job, "ett.phase": label,
                             "ett.component": component or component_of(label)}
        if attempt is not None:
            attrs["ett.attempt"] = attempt
        return Finished(PHASE_SPAN_PREFIX + label, attempt, s, e, attrs)

    def _held(self, a: _Attempt, label: str, start: int, end: int) -> None:
        """Remember a reported save phase: it may hold a save's blocking time."""
        if label in _BLOCKING:
            kept = a.held.setdefault(label, [])
            kept.append((start, end))
            del kept[:-_HELD_KEPT]

    def _settle(self, a: _Attempt, label: str) -> list[SpanAction]:
        """A phase of `label` ended: the saves that waited for it are held by it (no span
        of their own), or still wait for another open one that began before them, or get
        their own blocking span."""
        out: list[SpanAction] = []
        waiting = []
        for s, e, lbl in a.pending:
            if lbl == label and _holds(a.held.get(label, ()), s, e):
                continue
            if lbl != label or self._open_before(a.id, label, s):
                waiting.append((s, e, lbl))
            else:
                out.append(self._phase_span(a.id, label, "", s, e, a))
        a.pending = waiting
        return out

    def _open_before(self, attempt: str, label: str, at: int) -> bool:
        return any(start <= at for (att, phase, _), starts in self._open.items()
                   if att == attempt and phase == label for start, _ in starts)

    def _save(self, e: CheckpointSaved) -> list[SpanAction]:
        """The whole save as a span; its blocking part as a phase, unless a reported phase
        holds it (or may: one of its label is open since before the save began)."""
        s = to_us(e.start_ts)
        a, out = self._attempt(e.attempt, s)
        if a is None:
            return out
        out.append(Finished(SAVE_SPAN, e.attempt, s, s + to_us(e.total_s), {
            "ett.job": self.job, "ett.attempt": e.attempt, "ett.checkpoint.step": e.step,
            "ett.checkpoint.cursor": e.cursor, "ett.checkpoint.bytes": e.bytes,
            "ett.checkpoint.blocking_s": e.blocking_s, "ett.checkpoint.total_s": e.total_s,
            "ett.checkpoint.final": e.final}))
        label = _BLOCKING[1] if e.final else _BLOCKING[0]
        blocking_end = s + to_us(e.blocking_s)
        if _holds(a.held.get(label, ()), s, blocking_end):
            return out
        if self._open_before(e.attempt, label, s):
            if len(a.pending) < _HELD_KEPT:
                a.pending.append((s, blocking_end, label))
            return out
        out.append(self._phase_span(e.attempt, label, "", s, blocking_end, a))
        return out

    # -- progress ----------------------------------------------------------------------

    def _progress(self, e: Progress) -> list[SpanAction]:
        """Lay the progress as `attribution.implied._lay_steps` does; the first that
        passes the high-water mark gives the first effective step (and the replay
        before it)."""
        a, out = self._attempt(e.attempt, to_us(e.start_ts))
        if a is None:
            return out
        lo = max(to_us(e.start_ts), a.last_end)
        hi = max(to_us(e.ts), lo)
        a.last_end, a.progressed = hi, True
        if not a.decided:
            if not self._known:
                a.decided = True  # the mark never came: no first effective step
            else:
                out += self._first_effective(a, e, lo, hi)
        if e.cursor_end > self._hwm:
            self._hwm = e.cursor_end
        return out

    def _first_effective(self, a: _Attempt, e: Progress, lo: int, hi: int
                         ) -> list[SpanAction]:
        hwm, c0, c1 = self._hwm, e.cursor_start, e.cursor_end
        if c1 <= hwm or c1 == c0:  # replay (or no new data)
            if a.replay_from is None:
                a.replay_from = lo
            return []
        effective = lo
        if c0 < hwm:  # straddles the mark: cut in proportion to the cursor
            effective = lo + (hi - lo) * (hwm - c0) // (c1 - c0)
            if a.replay_from is None:
                a.replay_from = lo
        a.decided = True
        out: list[SpanAction] = []
        if a.replay_from is not None and effective > a.replay_from:
            out.append(self._replay(a, effective))
        attrs: Attributes = {"ett.job": self.job, "ett.attempt": a.id,
                             "ett.component": "effective_training",
                             "ett.step": e.step_end, "ett.cursor": c1}
        if hwm != _NO_MARK:
            attrs["ett.high_water"] = hwm
        out.append(Finished(FIRST_EFFECTIVE_SPAN, a.id, effective, hi, attrs))
        return out

    def _replay(self, a: _Attempt, end: int) -> Finished:
        assert a.replay_from is not None
        attrs: Attributes = {"ett.job": self.job, "ett.attempt": a.id,
                             "ett.component": "wasted_training"}
        if self._hwm != _NO_MARK:
            attrs["ett.high_water"] = self._hwm
        return Finished(REPLAY_SPAN, a.id, a.replay_from, max(end, a.replay_from), attrs)


def _holds(spans: Iterable[tuple[int, int]], start: int, end: int) -> bool:
    """Some reported span starting at or before `start` ends at or after `end`
    (`attribution.explicit._Held.holds`)."""
    return any(lo <= start and hi >= end for lo, hi in spans)


def high_water_of(events: Iterable[Event], *, besides: str | None = None) -> int | None:
    """The cursor high-water mark in `events`: the largest cursor rank 0's progress
    reached, not counting attempt `besides`; None when there was no progress."""
    marks = [e.cursor_end for e in events
             if isinstance(e, Progress) and not e.rank and e.attempt != besides]
    return max(marks) if marks else None
