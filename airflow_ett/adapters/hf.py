"""Hugging Face Transformers: a `TrainerCallback` that makes `Trainer.train` a job.

```python
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint
from airflow_ett.adapters import job
from airflow_ett.adapters.hf import EttHFCallback

with job() as ett:
    args = TrainingArguments(output_dir=str(ett.checkpoint_dir), save_steps=50, max_steps=1000)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[EttHFCallback(ett)])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))
```

What it reports: process start -> `on_init_end` as trainer_init (imports, the model, the
Trainer), `on_init_end` -> `on_train_begin` as checkpoint_restore (the data loader, the
weights and the trainer state loaded), the wait for the first step as first_batch; each
optimizer step as progress (the cursor is `global_step * samples_per_step`), and each
save with its blocking time, from the `on_step_end` that decided it to `on_save` (an
evaluation the same step runs first is inside it).

Leaving: an `at_checkpoint` request is claimed as a save is decided (rank 0) and, once
`on_save` came, `should_training_stop` ends `train()`; leaving the `with job()` block
then exits 75. On SIGTERM the step in progress ends, a save is asked for unless the
step is saved already (or the request asks to leave unsaved), and training stops: the
block exits 75.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from airflow_ett.adapters.job import EttJob, whole


class EttHFCallback(TrainerCallback):
    """Reports a Hugging Face `Trainer.train` through `job`; leaves when asked.

    :param job: the attempt (`with airflow_ett.adapters.job() as ett`).
    :param samples_per_step: data units one optimizer step reads (the cursor's unit);
        default 1 (the cursor is the global step).
    """

    def __init__(self, job: EttJob, *, samples_per_step: int = 1) -> None:
        self.job = job
        self.samples_per_step = whole("samples_per_step", samples_per_step, 1)
        self._marks: dict[str, float] = {}
        self._first = True
        self._save_start: float | None = None

    def on_init_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        now = time.time()
        self.job.record_phase("trainer_init", self.job.entered, now)
        self._marks["init_end"] = now

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        now = time.time()
        self.job.record_phase("checkpoint_restore", self._marks.get("init_end", now), now)
        self._marks["train_begin"] = now
        self.job.resumed(state.global_step, self._cursor(state.global_step))

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        now = time.time()
        if self._first:
            self._first = False
            self.job.record_phase("first_batch", self._marks.get("train_begin", now), now)
        self.job.begin_step(now)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self.job.step(state.global_step, self._cursor(state.global_step))
        if self.job.should_leave:  # SIGTERM: save (unless saved or told not to), stop
            control.should_save = self.job.should_save
            control.should_training_stop = True
        if control.should_save:
            self._save_start = self.job.save_started()

    def on_save(self, args: TrainingArguments, state: TrainerState,
                control: TrainerControl, **kwargs: Any) -> None:
        start, self._save_start = self._save_start, None
        self.job.save_ended(time.time() if start is None else start, state.global_step,
                            self._cursor(state.global_step))
        if self.job.should_leave:
            control.should_training_stop = True

    def _cursor(self, step: int) -> int:
        return step * self.samples_per_step
