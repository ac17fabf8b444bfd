"""What a pipeline's source is and what it hands back: `Source`, `RawBatch`, the cursor.

The contract between the two sources (the generated log, `data_gen.ClickLogSpec`; the
owner's files, `files.FileSource`) and the pipeline that runs them in spawned workers
(`data_workers.WorkerPool`) and turns their batches into tensors (`data.py`). A source
is picklable (it crosses into each worker), torch-free, and a pure function of the
cursor once prepared: the whole pipeline state is one integer, so a restore at cursor
`c` yields exactly the batches a run that never stopped would have from `c` on, whatever
the number of workers or ranks. numpy and the standard library only, so that a worker,
which pays for every import of the modules it unpickles, starts in a fraction of a
second.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["RawBatch", "Source", "check_cursor", "check_rank", "is_int"]


def is_int(value: object) -> bool:
    """An int or numpy integer, not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_cursor(cursor: object, what: str = "cursor") -> int:
    """Return `cursor` as an int, or raise ValueError naming it: cursors are ints >= 0."""
    if not isinstance(cursor, int | np.integer) or isinstance(cursor, bool) or cursor < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {cursor!r}")
    return int(cursor)


def check_rank(rank: object, world_size: object) -> None:
    """Raise ValueError unless `world_size` >= 1 and `rank` is in [0, world_size)."""
    if not is_int(world_size) or int(world_size) < 1:  # type: ignore[call-overload]
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not is_int(rank) or not 0 <= int(rank) < int(world_size):  # type: ignore[call-overload]
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")


class RawBatch(NamedTuple):
    """One rank's batch as numpy arrays: what crosses the process boundary.

    `values` (int64) and `lengths` (int32, `num_features * rows`) are the sparse ids in
    the KeyedJaggedTensor's key-major order. `cursor_start/end` are the GLOBAL range of
    the step (all ranks together), not this rank's rows. `skipped` counts this rank's
    rows of that range that could not be read (bad rows: the batch has that many rows
    fewer), `problems` says what was wrong with the first few, each naming file, row and
    column.
    """

    cursor_start: int
    cursor_end: int
    dense: npt.NDArray[np.float32]
    values: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int32]
    labels: npt.NDArray[np.float32]
    skipped: int = 0
    problems: tuple[str, ...] = ()


class Source(Protocol):
    """Where a pipeline's batches come from: the generated log (`ClickLogSpec`) or the
    owner's files (`files.FileSource`). Picklable (it crosses into spawned workers),
    torch-free. `prepare` runs once, in the consumer, before workers start (indexing
    files: what every worker then shares); `rank_batch` is a pure function of the cursor
    for a prepared source."""

    @property
    def batch_size(self) -> int: ...

    @property
    def feature_names(self) -> list[str]: ...

    @property
    def num_dense(self) -> int: ...

    @property
    def max_ids(self) -> tuple[int, ...]: ...

    def prepare(self) -> Source: ...

    def rank_batch(self, cursor: int, rank: int = 0, world_size: int = 1) -> RawBatch: ...
