"""TorchRec: a wrapper of a `TrainPipeline` whose `progress()` reports the job's steps.

```python
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from airflow_ett.adapters import job
from airflow_ett.adapters.torchrec import EttTrainPipeline

with job() as ett:
    step = restore(model, optimizer)                   # your DCP checkpoint, if any
    pipeline = EttTrainPipeline(TrainPipelineSparseDist(model, optimizer, device), ett,
                                start_step=step, samples_per_step=batch_size * world_size)
    it = iter(dataloader)
    while pipeline.step < steps and not ett.should_leave:
        pipeline.progress(it)
        if pipeline.step % 100 == 0:
            with ett.checkpoint(pipeline.step):
                save(model, optimizer, pipeline.step)
```

The first `progress()` call is the pipeline's own start-up (it connects the iterator,
fetches and copies the first batches, starts the input distribution) together with the
first step: it is reported as `first_batch`, start-up time, as our trainer reports its
first step. Every later call is one step: its start and end, the step count
(`start_step` + calls) and the cursor (`step * samples_per_step`). `StopIteration` (the
data ran out) goes on up, counted as no step. Everything else is the pipeline's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from torchrec.distributed.train_pipeline import TrainPipeline

from airflow_ett.adapters.job import EttJob, whole

In = TypeVar("In")
Out = TypeVar("Out")


class EttTrainPipeline(Generic[In, Out]):
    """`pipeline`, its `progress()` reported through `job`.

    :param start_step: the step the trainer restored (0: a fresh start).
    :param samples_per_step: data units one step reads across ranks (the cursor's unit).
    """

    def __init__(self, pipeline: TrainPipeline[In, Out], job: EttJob, *, start_step: int = 0,
                 samples_per_step: int = 1) -> None:
        self.pipeline, self.job = pipeline, job
        self.samples_per_step = whole("samples_per_step", samples_per_step, 1)
        self.step = whole("start_step", start_step, 0)
        self._started = False
        job.resumed(start_step, start_step * samples_per_step)

    def progress(self, dataloader_iter: Iterator[In]) -> Out:
        begin = time.time()
        if not self._started:
            out: Out = self.pipeline.progress(dataloader_iter)  # StopIteration: no step
            self._started = True
            self.job.record_phase("first_batch", begin, time.time())
            self._stepped(time.time(), known_start=False)
            return out
        out = self.pipeline.progress(dataloader_iter)
        self.job.begin_step(begin)
        self._stepped(time.time(), known_start=True)
        return out

    def _stepped(self, now: float, *, known_start: bool) -> None:
        self.step += 1
        self.job.step(self.step, self.step * self.samples_per_step, ts=now,
                      startup=not known_start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipeline, name)
