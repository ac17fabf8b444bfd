"""DCP checkpoints that cost the training loop as little as possible and never lie about
being done (in the spirit of torchtitan's CheckpointManager; decision 0028).

Three promises, each kept by its modules:

1. **A checkpoint counts only when complete** (`commit`): DCP writes into a temp
   directory, the coordinator renames it to `step-<step:010d>/` and writes the commit
   marker `COMMITTED.json` last (`marker`: `CommitMarker`, its one writer and its one
   reader), with the size and CRC32 of every file. A crash at any point leaves nothing
   that restore accepts.
2. **Restore takes the newest checkpoint that is really valid** (`restore`,
   `integrity`): a step directory without a readable, matching marker, with files that
   differ from it, or whose DCP load raises is skipped with a warning naming it and why,
   and the previous one is tried. Validation happens before any tensor is touched; if a
   load fails half-way and nothing older loads either, restore raises rather than train
   on half-loaded weights. Checkpoints are read as untrusted input (`files`, `reader`;
   decision 0006).
3. **Saving blocks the caller only for a memory copy** (`staging`), and with
   `overlap_staging` only for a barrier before training next modifies the state; at most
   one save is in flight.

Every checkpoint collective goes through a gloo group of its own (`coord`), and
`manager.CheckpointManager` orchestrates the rest. Figures: bench/RESULTS.md,
"Checkpoint blocking".
"""

from __future__ import annotations

from airflow_ett.trainer.checkpoint.coord import checkpoint_process_group
from airflow_ett.trainer.checkpoint.manager import CheckpointManager
from airflow_ett.trainer.checkpoint.marker import (
    COMMIT_MARKER,
    CommitMarker,
    FileRecord,
    read_marker,
    step_dir_name,
)
from airflow_ett.trainer.checkpoint.results import (
    CheckpointError,
    RestoreResult,
    SaveResult,
    StateDict,
)
from airflow_ett.trainer.checkpoint.staging import StagingBreakdown

__all__ = [
    "COMMIT_MARKER",
    "CheckpointError",
    "CheckpointManager",
    "CommitMarker",
    "FileRecord",
    "RestoreResult",
    "SaveResult",
    "StagingBreakdown",
    "StateDict",
    "checkpoint_process_group",
    "read_marker",
    "step_dir_name",
]
