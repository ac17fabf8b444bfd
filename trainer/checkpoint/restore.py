"""The restore walk: the newest checkpoint that is really valid, loaded on every rank.

Newest first, the coordinator judges each step directory (`integrity`, through the
manager's `_validate`) and broadcasts its verdict, so that every rank tries the same
checkpoint; every rank then loads it through the restricted reader and all ranks share
whether any load failed. An invalid checkpoint, or one whose load failed on any rank, is
skipped with a warning naming it and why, and the previous one is tried. A load that
failed may have modified the state in place: if nothing older loads over it, the walk
raises `CheckpointError` rather than let training start "from scratch" on half-loaded
weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from airflow_ett.trainer.checkpoint.commit import step_dirs
from airflow_ett.trainer.checkpoint.coord import _Coord
from airflow_ett.trainer.checkpoint.marker import CommitMarker, JsonObject
from airflow_ett.trainer.checkpoint.reader import load_into
from airflow_ett.trainer.checkpoint.results import CheckpointError, RestoreResult, StateDict

log = logging.getLogger("airflow_ett.trainer.checkpoint")

#: (reason the checkpoint at a path is invalid, None) or (None, its marker).
Verdict: TypeAlias = tuple[str | None, CommitMarker | None]
#: The coordinator's judge of a step directory; never raises.
Validate: TypeAlias = Callable[[Path], Verdict]


def restore_newest(
    coord: _Coord, directory: Path, state: StateDict, validate: Validate
) -> RestoreResult | None:
    """Load the newest valid checkpoint under `directory` into `state` in place; None if
    none. Every rank calls it; `validate` runs on the coordinator alone."""
    candidates: list[str] = coord.broadcast(
        [str(p) for p in step_dirs(directory)] if coord.is_coordinator else []
    )
    skipped: list[tuple[Path, str]] = []
    load_failed = False
    for name in candidates:
        path = Path(name)
        verdict: Verdict = (None, None)
        if coord.is_coordinator:
            verdict = validate(path)
        reason, marker = coord.broadcast(verdict)
        if reason is None and marker is not None:
            error = load_into(state, path, coord.group)
            errors = [e for e in coord.all_gather(error) if e is not None]
            if not errors:
                log.info("restored checkpoint %s (step %d)", path, marker.step)
                return RestoreResult(
                    step=marker.step,
                    path=path,
                    extra=_extra_for(coord, marker),
                    skipped=skipped,
                )
            load_failed = True
            reason = f"DCP load failed: {errors[0]}"
        assert reason is not None
        log.warning("checkpoint %s skipped: %s", path, reason)
        skipped.append((path, reason))
    if load_failed:
        raise CheckpointError(
            "no checkpoint could be loaded and a failed load may have modified the state "
            f"in place; skipped: {skipped}"
        )
    if skipped:
        log.warning(
            "no valid checkpoint in %s (%d skipped): starting from scratch",
            directory,
            len(skipped),
        )
    return None


def _extra_for(coord: _Coord, marker: CommitMarker) -> JsonObject:
    """This rank's extra when the ranks saved different ones and the world size is
    unchanged; rank 0's otherwise."""
    extras = marker.rank_extras
    if extras is not None and len(extras) == coord.size:
        return dict(extras[coord.rank])
    return dict(marker.extra)
