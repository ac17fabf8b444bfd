"""When the training loop's next periodic checkpoint is due: the `checkpoint_interval` rule.

A step count, a duration (`"30s"`) or `"auto"`: a duration set by Young/Daly's optimum
(`airflow_ett.ett.checkpoint_math.auto_interval`) from what a save costs the loop and the
job's failure history, bounded below by that same cost (`interval_floor`: a save costs at
most a tenth of the time between saves and commits before the next begins). "auto"
chooses once when training starts (the cost from the history's CSBT, or 1 s) and again
after each save the loop has measured (`save_cost.MeasuredSave`: its blocking plus the
slowdown of the steps beside it). The history comes from the caller (the trainer reads
the job's events file or the ETT store), so the rule itself does no I/O and imports no
torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_ett.ett.checkpoint_math import auto_interval, interval_floor
from airflow_ett.trainer.save_cost import COST_SAMPLE, MeasuredSave, typical

if TYPE_CHECKING:
    from airflow_ett.trainer.config import TrainerConfig

log = logging.getLogger("airflow_ett.trainer")

#: (effective training seconds, failures, mean blocking seconds per save or None) so far.
History = Callable[[], tuple[float, int, float | None]]

#: What a save is taken to cost before one is measured and with no history of one.
UNMEASURED_COST_S = 1.0


@dataclass(slots=True)
class IntervalPolicy:
    """Due every `steps` steps, else every `seconds`; with `history` ("auto") `seconds` is
    chosen by `start` and re-chosen by `measured`. Neither set: never due."""

    steps: int | None = None
    seconds: float | None = None
    history: History | None = None
    last_step: int = 0
    last_time: float = 0.0
    measures: list[MeasuredSave] = field(default_factory=list)
    #: The history as read at start, and when (monotonic): read once an attempt, since
    #: the choice after every save runs on the loop's thread.
    known: tuple[float, int, float | None] | None = None
    known_at: float = 0.0

    @classmethod
    def from_config(cls, cfg: TrainerConfig, history: History) -> IntervalPolicy:
        auto = cfg.checkpoint_interval == "auto"
        return cls(steps=cfg.interval_steps(), seconds=cfg.interval_seconds(),
                   history=history if auto else None)

    def start(self, step: int, now: float | None = None) -> None:
        """Training starts at `step`. Under "auto" the first choice comes first, so that a
        slow history read does not count towards the first interval."""
        if self.history is not None:
            self.seconds = self._choose(None)
        self.last_step, self.last_time = step, time.time() if now is None else now

    def due(self, step: int, now: float) -> bool:
        if self.steps is not None:
            return step - self.last_step >= self.steps
        return self.seconds is not None and now - self.last_time >= self.seconds

    def next_save_ts(self, step: int, now: float, step_s: float | None,
                     last_step: int) -> float | None:
        """When the next save is expected to begin, as of `now` with `step` steps done: the
        periodic one this rule makes due (a time rule: at its due time, or at once when that
        has passed; a step rule: its due step at `step_s` seconds a step), or the final one
        after `last_step` when that comes first (no periodic save is made at the last
        step). None when it is unknown: no step rate measured yet for a count of steps.
        What the trainer reports on its progress (`Progress.next_save_ts`), so that the
        preemption controller knows when a victim could leave at a checkpoint."""
        ahead: list[float] = []
        if step_s is not None:
            ahead.append(now + max(0, last_step - step) * step_s)
        if step < last_step:
            if self.steps is not None and step_s is not None:
                ahead.append(now + max(0, self.last_step + self.steps - step) * step_s)
            elif self.steps is None and self.seconds is not None:
                ahead.append(max(now, self.last_time + self.seconds))
        return min(ahead, default=None)

    def saved(self, step: int, now: float) -> None:
        """A periodic save at `step` returned at `now`: the next interval starts."""
        self.last_step, self.last_time = step, now

    def measured(self, save: MeasuredSave) -> None:
        """The loop has measured a periodic save: under "auto", choose again from the
        typical cost of the latest ones (a save that cost nothing measurable keeps the
        choice)."""
        if self.history is not None and save.cost_s > 0:
            self.measures = [*self.measures[-(COST_SAMPLE - 1):], save]
            self.seconds = self._choose(typical(self.measures))

    def _choose(self, save: MeasuredSave | None) -> float:
        assert self.history is not None
        if save is None or self.known is None:
            self.known, self.known_at = self.history(), time.monotonic()
        train_s, failures, history_csbt = self.known
        if save is not None:  # trained since the read: failure-free, this attempt's own
            train_s += max(0.0, time.monotonic() - self.known_at)
        if save is None:
            cost, save_s, what = history_csbt or UNMEASURED_COST_S, 0.0, "CSBT"
        else:
            cost, save_s, what = save.cost_s, save.duration_s, "cost"
        choice = auto_interval(cost, train_s=train_s, failures=failures,
                               min_s=interval_floor(cost, save_s))
        slowdown = ("" if save is None or save.slowdown_s is None
                    else f" = blocking {save.blocking_s:.3f}s + slowdown {save.slowdown_s:.3f}s")
        # chosen again after every save: said when it moves by a tenth or more
        moved = (self.seconds is None
                 or abs(choice.interval_s - self.seconds) >= 0.1 * self.seconds)
        log.log(
            logging.INFO if moved else logging.DEBUG,
            "checkpoint interval auto: %.1fs (%s; %s %.3fs%s, MTBF %s)",
            choice.interval_s,
            choice.method,
            what,
            cost,
            slowdown,
            f"{choice.mtbf_s:.0f}s" if choice.mtbf_s else "unknown",
        )
        return choice.interval_s
