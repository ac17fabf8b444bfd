"""PyTorch Lightning: a `Callback` that makes a `Trainer.fit` a lifecycle job.

```python
import lightning as L
from airflow_ett.adapters import job
from airflow_ett.adapters.lightning import EttLightningCallback

with job() as ett:
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=ett.checkpoint_dir, save_last=True,
                                               every_n_train_steps=50)
    trainer = L.Trainer(max_steps=1000, callbacks=[EttLightningCallback(ett), ckpt])
    trainer.fit(model, datamodule, ckpt_path="last")   # resumes where the job left
```

What it reports: Lightning's start-up as phases (process start -> `setup`: trainer_init;
`setup` -> `on_fit_start`: model_creation (strategy setup, weights restored);
`on_fit_start` -> `on_train_start`: checkpoint_restore (the loops' state); then the wait
for the first batch: first_batch), each optimizer step as progress (the cursor is
`global_step * samples_per_step`), and every checkpoint save with its blocking time,
timed around the strategy's `CheckpointIO` (so an asynchronous `CheckpointIO` blocks only
as long as it really does).

Leaving: an `at_checkpoint` request is claimed as a save begins (rank 0) and, once that
save has returned, `trainer.should_stop` ends the fit (Lightning reduces it over ranks);
leaving the `with job()` block then exits 75. On SIGTERM (Lightning's own handler calls
ours too) the callback saves `last.ckpt` in the checkpoint callback's directory (or
`$ETT_CHECKPOINT_DIR`) unless the step is saved already, and Lightning's
`SIGTERMException` ends the fit: the block exits 75.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from airflow_ett.adapters.job import EttJob, whole


class _TimedCheckpointIO(CheckpointIO):
    """The strategy's CheckpointIO, each save timed and reported through the job."""

    def __init__(self, inner: CheckpointIO, callback: EttLightningCallback) -> None:
        self.inner, self._callback = inner, callback

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        start = self._callback.job.save_started()
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self._callback.saved(start)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        return self.inner.load_checkpoint(path, map_location=map_location,
                                          weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class EttLightningCallback(pl.Callback):
    """Reports a Lightning fit through `job` and leaves when the protocol asks.

    :param job: the attempt (`with airflow_ett.adapters.job() as ett`).
    :param samples_per_step: data units one optimizer step reads (the cursor's unit);
        default 1 (the cursor is the global step).
    """

    def __init__(self, job: EttJob, *, samples_per_step: int = 1) -> None:
        self.job = job
        self.samples_per_step = whole("samples_per_step", samples_per_step, 1)
        self._trainer: pl.Trainer | None = None
        self._marks: dict[str, float] = {}
        self._first = True
        self._reported = -1

    # -- start-up -----------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
        now = time.time()
        self.job.record_phase("trainer_init", self.job.entered, now)
        self._marks["setup"] = now
        strategy = trainer.strategy
        if not isinstance(strategy.checkpoint_io, _TimedCheckpointIO):
            strategy.checkpoint_io = _TimedCheckpointIO(strategy.checkpoint_io, self)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.time()
        self.job.record_phase("model_creation", self._marks.get("setup", now), now)
        self._marks["fit_start"] = now

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.time()
        self.job.record_phase("checkpoint_restore", self._marks.get("fit_start", now), now)
        self._marks["train_start"] = now
        self._reported = trainer.global_step
        self.job.resumed(trainer.global_step, self._cursor(trainer.global_step))

    # -- the loop ------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        now = time.time()
        if self._first:
            self._first = False
            self.job.record_phase("first_batch", self._marks.get("train_start", now), now)
        if batch_idx % max(1, trainer.accumulate_grad_batches) == 0:
            self.job.begin_step(now)  # an optimizer step begins

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step > self._reported:  # an optimizer step ended (not an accumulation batch)
            self._reported = step
            self.job.step(step, self._cursor(step), loss=_loss(outputs))
        if self.job.should_leave and self.job.should_save:
            trainer.save_checkpoint(self._sigterm_path(trainer))

    def saved(self, start: float) -> None:
        """A save through the strategy returned: reported; leave if a claim says so."""
        trainer = self._trainer
        step = trainer.global_step if trainer is not None else None
        self.job.save_ended(start, step, None if step is None else self._cursor(step))
        if trainer is not None and self.job.should_leave:
            trainer.should_stop = True

    def _cursor(self, step: int) -> int:
        return step * self.samples_per_step

    def _sigterm_path(self, trainer: pl.Trainer) -> Path:
        """Where the exit save goes: `last.ckpt` beside the checkpoint callback's, so
        `ckpt_path="last"` resumes from it."""
        callback = trainer.checkpoint_callback
        directory = getattr(callback, "dirpath", None) or self.job.checkpoint_dir
        if directory is None:
            directory = Path(trainer.default_root_dir) / "checkpoints"
        return Path(directory) / "last.ckpt"


def _loss(outputs: Any) -> float | None:
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if value is None or not hasattr(value, "detach"):
        return None
    try:
        return float(value.detach())
    except (TypeError, ValueError, RuntimeError):
        return None
