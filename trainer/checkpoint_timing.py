"""When the training loop takes a checkpoint: every moment and its rule, in one place.

An attempt saves at four moments and no other:

- periodic: after a step, when `SaveTiming.due` says so: the interval rule
  (`checkpoint_interval.IntervalPolicy`: steps, seconds or "auto"), one answer on every
  rank, never at the last step (the final save is that one). `Trainer._maybe_checkpoint`
  saves and tells the rule (`saved`); every step's end is told too (`step_ended`), so
  that what each save cost the steps beside it is measured (`save_cost`) and "auto"
  chooses from that.
- leaving at a checkpoint: a periodic save is where an `at_checkpoint` request is
  claimed; the attempt leaves once that save has committed, saving again only if it
  failed (`leaving.Leaving.at_checkpoint`).
- on SIGTERM, after the step: an exit save, unless the current step is committed already
  or the pending request says `skip_save` (`leaving.Leaving.on_sigterm`).
- final: `Trainer.finish`, unless the last step is committed already (`final_due`).

Every progress span says when the next save is expected (`next_save_ts`), so that the
preemption controller knows when a victim could leave at a checkpoint. "auto" starts from
the job's failure history (`_history`: its events file or the ETT store).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from airflow_ett.trainer.checkpoint_interval import IntervalPolicy
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.identity import DistEnv
from airflow_ett.trainer.save_cost import MeasuredSave, SaveCost

log = logging.getLogger("airflow_ett.trainer")


@dataclass(slots=True)
class SaveTiming:
    """The interval rule as the loop asks it: `start` once training starts, `due` after
    each step, `saved` after each periodic save; `last_step` is the job's last."""

    interval: IntervalPolicy
    env: DistEnv
    last_step: int
    cost: SaveCost = field(default_factory=SaveCost)

    @classmethod
    def from_config(cls, cfg: TrainerConfig, job_id: str, env: DistEnv) -> SaveTiming:
        return cls(IntervalPolicy.from_config(cfg, lambda: _history(cfg, job_id)), env,
                   cfg.steps)

    def start(self, step: int) -> None:
        """Training starts (again) at `step`."""
        self.interval.start(step)

    def due(self, step: int, now: float) -> bool:
        """Whether the periodic save is due after `step` (never at the last step: the
        final save is that one), the same answer on every rank. A step interval gives it
        by itself: every rank counts the same steps. A time interval ("30s", "auto") does
        not: each rank reads its own clock against the end of its own last save (and
        under "auto" chooses the interval from its own blocking time), so near the
        boundary one rank would begin a save while another stepped on, and their
        collectives would pair wrongly or hang. With more than one rank, rank 0's answer
        goes to all: one scalar per step over the default group (never used by a
        background commit), after a step that has already waited for its loss."""
        if step >= self.last_step:
            return False
        interval = self.interval
        due = interval.due(step, now)
        if (self.env.world_size == 1 or not dist.is_initialized() or interval.steps is not None
                or interval.seconds is None):
            return due
        flag = torch.tensor([1 if due else 0], dtype=torch.int32, device=self.env.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def saved(self, step: int, started: float, returned: float, blocking_s: float, *,
              in_flight: bool) -> None:
        """A periodic save at `step`, called at `started`, returned at `returned` after
        blocking `blocking_s`; `in_flight`: it goes on in the background."""
        self.interval.saved(step, returned)
        self._measured(self.cost.save_returned(step, started, returned, blocking_s,
                                               in_flight=in_flight))

    def step_ended(self, now: float, *, saving: bool) -> MeasuredSave | None:
        """A step ended at `now` (`saving`: a save is in flight); when that completes the
        measure of a save, "auto" chooses again from its cost."""
        return self._measured(self.cost.step_ended(now, saving=saving))

    def _measured(self, save: MeasuredSave | None) -> MeasuredSave | None:
        if save is not None:
            log.debug("checkpoint step %d cost the loop %.3fs: blocking %.3fs + slowdown %s "
                      "over %d steps; committed %.2fs after it began", save.step,
                      save.cost_s, save.blocking_s,
                      "unknown" if save.slowdown_s is None else f"{save.slowdown_s:.3f}s",
                      save.steps, save.duration_s)
            self.interval.measured(save)
        return save

    def next_save_ts(self, step: int, now: float, step_s: float | None) -> float | None:
        """When the next save is expected to begin (`progress.Schedule`)."""
        return self.interval.next_save_ts(step, now, step_s, self.last_step)

    @staticmethod
    def final_due(step: int, latest_committed: int | None) -> bool:
        """Whether the final save is needed: not when `step` is committed already."""
        return latest_committed != step


def _history(cfg: TrainerConfig, job_id: str) -> tuple[float, int, float | None]:
    """(effective training seconds, failures, mean blocking per save) of this job so far,
    from its events file or the ETT store; zeros when neither can be read."""
    from airflow_ett.ett.attribution import attribute_job
    from airflow_ett.ett.summary import JobSummary

    try:
        summary: JobSummary
        if cfg.events_file is not None:
            from airflow_ett.ett.events import read_events

            events = [e for e in read_events(str(cfg.events_file)).events if e.job == job_id]
            if not events:
                return 0.0, 0, None
            summary = attribute_job(events).summary()
        else:
            from airflow_ett.store import EttStore

            with EttStore() as store:  # the [ett] store_url
                summary = store.job_summary(job_id)
    except Exception as exc:
        log.info("no failure history for %s (%s): assuming none", job_id, exc)
        return 0.0, 0, None
    return summary.effective_s, summary.failure_count, summary.blocking_per_save_s
