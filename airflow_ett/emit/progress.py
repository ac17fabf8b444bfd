"""Per-step reports coalesced into progress spans: what any trainer that is not ours
reports through (the adapters, and the train task reading a command's log lines).

A trainer says "step `s` is done, the data cursor is at `c`" once per step; the ETT model
needs spans (steps `[s0, s1)` read `[c0, c1)` between two times) and the store needs few
events. `ProgressSpans` keeps one open span and extends it while steps follow each other
with no gap (a step starts where the previous one ended), sending it once it covers
`flush_s` seconds, when a gap opens (a save that blocked, an evaluation: the model sees
that time as not training), when the steps go backwards (a restart restored an older
step), and on `flush()`.

Where a step starts: at the `begin(ts)` mark when the trainer gives one (the adapters
whose library has a batch-start hook do), else where the previous step ended. The first
step of an attempt without a mark has no known start: its time stays outside the span
(with the start-up, as "first batch"). Its cursor start is the `resumed(step, cursor)`
mark when there is one, else inferred from a uniform batch (`cursor / step` per step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from airflow_ett.emit.emitter import Emitter

#: How long a span grows before it is sent: the store gets about one event a second.
FLUSH_S: Final = 1.0


@dataclass(slots=True)
class _Span:
    step_start: int
    cursor_start: int
    start_ts: float
    step_end: int
    cursor_end: int
    end_ts: float
    loss: float | None = None


class ProgressSpans:
    """Coalesces one reporter's per-step reports into `progress` events."""

    def __init__(self, emitter: Emitter, *, flush_s: float = FLUSH_S) -> None:
        self._emitter, self._flush_s = emitter, flush_s
        self._open: _Span | None = None
        self._last: tuple[int, int, float] | None = None  # (step, cursor, ts) of the last end
        self._begin: float | None = None

    def resumed(self, step: int, cursor: int) -> None:
        """The trainer restored `step` at `cursor`: the next step starts there."""
        self.flush()
        self._last = (int(step), int(cursor), -1.0)

    def begin(self, ts: float | None = None) -> None:
        """The next step starts now (or at `ts`)."""
        self._begin = time.time() if ts is None else ts

    def step(self, step: int, cursor: int | None = None, *, ts: float | None = None,
             loss: float | None = None) -> None:
        """Step `step` (the count of steps done, 1-based) ended now (or at `ts`), the
        cursor at `cursor` (default: `step`, one unit of data per step)."""
        now = time.time() if ts is None else ts
        step = int(step)
        cursor = step if cursor is None else int(cursor)
        begin, self._begin = self._begin, None
        last = self._last
        if last is not None and (step <= last[0] or cursor < last[1]):
            self.flush()  # backwards: a restore; the last end is no start for this one
            last = None
        if last is None:
            per_step = cursor // step if step > 0 else 0
            s0, c0, t0 = step - 1, max(0, cursor - per_step), begin
        else:
            s0, c0 = last[0], last[1]
            t0 = begin if begin is not None else (last[2] if last[2] >= 0 else None)
        self._last = (step, cursor, now)
        if t0 is None or t0 > now:  # no known start: outside every span
            self.flush()
            return
        span = self._open
        if span is not None and (span.step_end, span.cursor_end, span.end_ts) == (s0, c0, t0):
            span.step_end, span.cursor_end, span.end_ts = step, cursor, now
            span.loss = loss if loss is not None else span.loss
        else:
            self.flush()
            self._open = span = _Span(s0, c0, t0, step, cursor, now, loss)
        if span.end_ts - span.start_ts >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        """Send the open span, if any."""
        span, self._open = self._open, None
        if span is not None:
            self._emitter.progress(span.step_start, span.step_end, span.cursor_start,
                                   span.cursor_end, span.start_ts, span.end_ts, span.loss)
