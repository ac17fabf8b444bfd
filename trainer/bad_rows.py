"""The job's bad data rows against `data.max_bad_rows` (docs/model-contract.md).

The owner's files may hold rows that cannot be trained on; each is skipped by the data
workers, named in the log and counted here. The limit is the job's, not an attempt's or
a rank's: the count is kept in every checkpoint (`at_save`, with the cursor) and restored
with it, and each rank checks the job's count at the last save plus its own since, so
that no rank needs a collective per step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from airflow_ett.trainer.identity import DistEnv

if TYPE_CHECKING:  # torchrec (data) loads late
    from airflow_ett.trainer.data import Batch

log = logging.getLogger("airflow_ett.trainer")


@dataclass(slots=True)
class BadRows:
    """`job`: data rows skipped by the whole job as of the last save or restore
    (checkpointed with the cursor); `here`: by this rank since then."""

    limit: int
    env: DistEnv
    job: int = 0
    here: int = 0

    def count(self, batch: Batch) -> None:
        """Bad rows of this batch against `data.max_bad_rows` (a job's count, kept in its
        checkpoints): each named in the log, and past the limit a `DataError` (each rank
        checks the job's count at the last save plus its own since)."""
        from airflow_ett.trainer.files import DataError

        self.here += batch.skipped
        for problem in batch.problems:
            log.warning("bad row skipped: %s", problem)
        if batch.skipped > len(batch.problems):
            log.warning("%d more bad rows skipped in the batch at cursor %d",
                        batch.skipped - len(batch.problems), batch.cursor_start)
        limit = self.limit
        seen = self.job + self.here
        if seen > limit:
            last = batch.problems[-1] if batch.problems else "see the log"
            raise DataError(f"data: {seen} bad rows, more than max_bad_rows = {limit}"
                            f" (the last: {last})")

    def at_save(self) -> int:
        """The job's bad rows now: every rank's since the last save added up (one small
        collective per save, on the default group, which a background commit never
        uses; every rank saves at the same step), then kept as the new base."""
        here = self.here
        if self.env.world_size > 1 and dist.is_initialized():
            count = torch.tensor([here], dtype=torch.int64, device=self.env.device)
            dist.all_reduce(count)
            here = int(count.item())
        self.job, self.here = self.job + here, 0
        return self.job
