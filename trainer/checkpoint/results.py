"""What a checkpoint save or restore hands its caller: its result, or `CheckpointError`.

Apart from the manager so that every module of the package (the group, the commit) can
raise the one error the caller catches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    """The checkpoint a restore loaded, the `extra` saved with it, and what it skipped."""

    step: int
    path: Path
    extra: dict[str, Any]
    skipped: list[tuple[Path, str]]
