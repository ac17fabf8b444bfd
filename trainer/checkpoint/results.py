"""What a checkpoint save or restore hands its caller: its result, or `CheckpointError`;
and what it takes, a DCP state dict (`StateDict`).

Apart from the manager so that every module of the package (the group, the commit) can
raise the one error the caller catches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE
from torch.distributed.checkpoint.stateful import Stateful

#: What a save writes and a restore loads into: DCP's state dict, whose top-level values
#: are `Stateful`s (their `state_dict()` is what is saved, `load_state_dict` what a
#: restore calls) or nested dicts, lists and tensors.
StateDict: TypeAlias = STATE_DICT_TYPE[Stateful]


class CheckpointError(RuntimeError):
    """A save did not commit, or a restore could not leave the state consistent."""


@dataclass(frozen=True)
class SaveResult:
    """What one save cost and where it went.

    `blocking_s` is how long `save()` held up its caller: the wait for the previous save,
    if one was in flight, plus the staging copy (async), or the whole durable write and
    commit (synchronous). With `overlap_staging`, the result `save()` returns counts its
    own time only; the final one (`wait()`, `on_commit`, the marker) adds the caller's
    wait at the staging barrier. `total_s` runs from the `save()` call to the commit (the marker
    written and fsynced), so it always includes `blocking_s`; it and `bytes` (all ranks'
    DCP files) are None while the save is in flight.
    """

    step: int
    path: Path
    blocking_s: float
    total_s: float | None
    bytes: int | None


@dataclass(frozen=True)
class RestoreResult:
    """The checkpoint a restore loaded, the `extra` saved with it (the JSON object the
    caller gave `save`), and what it skipped."""

    step: int
    path: Path
    extra: dict[str, object]
    skipped: list[tuple[Path, str]]
