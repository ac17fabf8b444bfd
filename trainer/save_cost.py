"""What a checkpoint save really costs the loop: its blocking time (CSBT) plus the
slowdown of the steps that run while it is written in the background.

A background save shares the host with training (its copy-out and write threads, the
file system), so the steps that run while it is in flight take longer than steady ones:
a cost CSBT does not count. `SaveCost` measures it per save, in the loop's own thread
and clock: each step's time (from the end of the step before, less the time the loop
spent inside a save call) against the median of the recent steady steps (no save in
flight), summed over the steps that began before the save committed. The "auto"
checkpoint interval takes this cost into Young/Daly's optimum and its lower bound
(`ett.checkpoint_math.interval_floor`), where a fixed 30 s floor stood before.

No torch, no I/O: the loop tells it when a step ended and whether a save is in flight.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Steady steps the baseline median is taken over.
STEADY_WINDOW = 64
#: Fewer steady steps than this before a save: its slowdown is unknown (no baseline).
MIN_STEADY = 5
#: How many of the latest measured saves `typical` is the median of.
COST_SAMPLE = 5


@dataclass(frozen=True, slots=True)
class MeasuredSave:
    """One periodic save as the loop felt it: `blocking_s` inside the save call,
    `slowdown_s` summed over the `steps` that began before its commit (None: no steady
    baseline yet), `duration_s` from its start to the end of the last of them."""

    step: int
    blocking_s: float
    slowdown_s: float | None
    steps: int
    duration_s: float

    @property
    def cost_s(self) -> float:
        """Blocking plus slowdown: the loop's loss to this save (never below blocking)."""
        return self.blocking_s + max(0.0, self.slowdown_s or 0.0)


@dataclass(slots=True)
class _Open:
    step: int
    start: float
    blocking_s: float
    baseline_s: float | None
    extra_s: float = 0.0
    steps: int = 0


@dataclass(slots=True)
class SaveCost:
    """Call `step_ended` after every step and `save_returned` after every periodic save
    call; `step_ended` returns the save it finished measuring, once that has committed."""

    _steady: deque[float] = field(default_factory=lambda: deque(maxlen=STEADY_WINDOW))
    _last_end: float | None = None
    _paused_s: float = 0.0
    _open: _Open | None = None
    last: MeasuredSave | None = None

    def save_returned(self, step: int, started: float, returned: float, blocking_s: float,
                      *, in_flight: bool) -> MeasuredSave | None:
        """A periodic save of `step` was called at `started` and returned at `returned`,
        blocking the loop `blocking_s` of it (the call's time is not a step's);
        `in_flight`: it goes on in the background. Returns the save this measured: this
        one if it has committed, else the one before if the call waited for it."""
        self._paused_s += max(0.0, returned - started)
        done = None
        if self._open is not None:  # the save before was still in flight: the call waited
            done = self.last = self._measured(self._open, started)
        baseline = (statistics.median(self._steady) if len(self._steady) >= MIN_STEADY
                    else None)
        this = _Open(step, started, max(0.0, blocking_s), baseline)
        if in_flight:
            self._open = this
            return done
        self._open = None  # committed inside the call: no step ran beside it
        self.last = self._measured(this, returned)
        return self.last

    def step_ended(self, now: float, *, saving: bool) -> MeasuredSave | None:
        """A step ended at `now`; `saving`: a save is in flight (not yet committed)."""
        last, self._last_end = self._last_end, now
        paused, self._paused_s = self._paused_s, 0.0
        if last is None:  # the first step of this attempt: its time includes start-up
            return None
        took = max(0.0, now - last - paused)
        current = self._open
        if current is None:
            self._steady.append(took)
            return None
        # this step began while the save was in flight: it ran beside it
        current.steps += 1
        if current.baseline_s is not None:
            current.extra_s += took - current.baseline_s
        if saving:
            return None
        self._open = None  # committed while this step ran: the next one runs steady
        self.last = self._measured(current, now)
        return self.last

    @staticmethod
    def _measured(save: _Open, until: float) -> MeasuredSave:
        return MeasuredSave(
            step=save.step, blocking_s=save.blocking_s,
            slowdown_s=None if save.baseline_s is None else max(0.0, save.extra_s),
            steps=save.steps, duration_s=max(0.0, until - save.start))


def typical(saves: Sequence[MeasuredSave]) -> MeasuredSave:
    """The median save of `saves` (the latest `COST_SAMPLE`), field by field: one save's
    slowdown is noisy (the steps beside it share the host with everything else)."""
    recent = list(saves)[-COST_SAMPLE:]
    if not recent:
        raise ValueError("typical() of no saves")
    known = [s.slowdown_s for s in recent if s.slowdown_s is not None]
    return MeasuredSave(
        step=recent[-1].step,
        blocking_s=statistics.median(s.blocking_s for s in recent),
        slowdown_s=statistics.median(known) if known else None,
        steps=round(statistics.median(s.steps for s in recent)),
        duration_s=statistics.median(s.duration_s for s in recent))
