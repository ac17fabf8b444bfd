"""What the train loop says about its steps: `progress` events and the log line.

`Progress` coalesces steps into spans of about a second, so that a fast loop does not
send an event per step, each carrying when the next checkpoint save is expected to begin
(`Schedule`: `checkpoint_timing.SaveTiming.next_save_ts`), which the preemption
controller reads (docs/decisions/0015-preemption.md). `StepLogger` writes the rate/ETA
line (docs/decisions/0004-trainer-choices.md, "The train loop's parts").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_ett.emit import Emitter

log = logging.getLogger("airflow_ett.trainer")

#: When the next checkpoint save is expected to begin: (steps done, now, seconds a step
#: lately or None) -> Unix seconds or None (`IntervalPolicy.next_save_ts`).
Schedule = Callable[[int, float, float | None], float | None]


@dataclass(slots=True)
class Progress:
    """Aggregates steps into progress spans of about a second, so a fast loop does not
    send an event per step; flushed before checkpoints, faults and at the end. Each span
    carries `schedule`'s answer as of its end (`next_save_ts`), the span's own steps
    giving the step rate."""

    emitter: Emitter
    schedule: Schedule | None = None
    span_s: float = 1.0
    start_ts: float | None = None
    step_start: int = 0
    step_end: int = 0
    cursor_start: int = 0
    cursor_end: int = 0
    loss: float | None = None

    def add(
        self,
        step: int,
        cursor_start: int,
        cursor_end: int,
        t0: float,
        t1: float,
        loss: float | None,
    ) -> None:
        if self.start_ts is None:
            self.start_ts, self.step_start, self.cursor_start = t0, step - 1, cursor_start
        self.step_end, self.cursor_end, self.loss = step, cursor_end, loss
        if t1 - self.start_ts >= self.span_s:
            self.flush(t1)

    def flush(self, end_ts: float | None = None) -> None:
        if self.start_ts is None:
            return
        end = time.time() if end_ts is None else end_ts
        steps = self.step_end - self.step_start
        step_s = max(0.0, end - self.start_ts) / steps if steps > 0 else None
        self.emitter.progress(
            self.step_start,
            self.step_end,
            self.cursor_start,
            self.cursor_end,
            self.start_ts,
            end,
            loss=self.loss,
            next_save_ts=(self.schedule(self.step_end, end, step_s)
                          if self.schedule is not None else None),
        )
        self.start_ts = None


@dataclass(slots=True)
class StepLogger:
    """The `step n/N  loss  samples/s  ETA` line, about every `every_s` and at the last
    step; rate and ETA are over the steps since the previous line."""

    total_steps: int
    samples_per_step: int
    every_s: float
    since: float = field(default_factory=time.time)
    steps: int = 0  # finished since `since`

    def step_done(self, step: int, loss: float, now: float) -> None:
        self.steps += 1
        if now - self.since < self.every_s and step != self.total_steps:
            return
        elapsed = now - self.since
        rate = self.steps * self.samples_per_step / max(elapsed, 1e-9)
        eta = (self.total_steps - step) * elapsed / max(self.steps, 1)
        log.info("step %d/%d  loss %.4f  %.0f samples/s  ETA %.0fs",
                 step, self.total_steps, loss, rate, eta)
        self.since, self.steps = now, 0
