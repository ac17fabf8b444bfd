"""Whether a step directory holds a checkpoint restore may load, decided before any tensor
is touched.

`check_step_dir` gives the reason a checkpoint is invalid, or its commit marker: no marker
or an unreadable one (the save never committed), a listed file that is no plain file of
the directory, a size that differs from the marker's (a truncated file), a CRC32 that
differs (`verify="checksum"`: damage; "size" skips the re-read for checkpoints too big to
read on every restart), or a `.metadata` that the restricted reader refuses or that points
DCP outside the listed files. A CRC is no authentication, so the metadata is read as
untrusted input even when every checksum matches (decision 0006). Restore skips an
invalid checkpoint with that reason and tries the previous one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from airflow_ett.trainer.checkpoint.commit import _DCP_METADATA
from airflow_ett.trainer.checkpoint.files import crc32_of, listed_file_problem, storage_problem
from airflow_ett.trainer.checkpoint.marker import (
    COMMIT_MARKER,
    CommitMarker,
    FileRecord,
    read_marker,
)
from airflow_ett.trainer.checkpoint.reader import UnsafeCheckpointError, load_checkpoint_metadata


def check_step_dir(
    path: Path, verify: Literal["checksum", "size"]
) -> tuple[str | None, CommitMarker | None]:
    """(reason the checkpoint at `path` is invalid, None) or (None, its marker). Raises
    only on the unexpected (the caller turns that into a reason too)."""
    if not (path / COMMIT_MARKER).exists():
        return "no commit marker (the save never committed)", None
    try:
        marker = read_marker(path)
    except (OSError, ValueError) as exc:
        return f"unreadable commit marker: {exc}", None
    files = marker.files
    if _DCP_METADATA not in files:
        return f"commit marker lists no {_DCP_METADATA}", None
    reason = next(filter(None, (listed_file_problem(path, name) for name in files)), None)
    if reason is None:
        reason = _size_mismatch(path, files)
    if reason is None and verify == "checksum":
        reason = _checksum_mismatch(path, files)
    if reason is None:
        reason = _unsafe_metadata(path, files)
    if reason is not None:
        return reason, None
    return None, marker


def _size_mismatch(path: Path, files: Mapping[str, FileRecord]) -> str | None:
    """The first listed file that is missing or not the size the commit marker says."""
    for name, want in sorted(files.items()):
        file = path / name
        try:
            size = file.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want.size:
            return f"{name} has {size} bytes, the commit marker says {want.size}"
    return None


def _checksum_mismatch(path: Path, files: Mapping[str, FileRecord]) -> str | None:
    """The first listed file unreadable or whose CRC32 differs from the commit marker's."""
    for name, want in sorted(files.items()):
        try:
            crc = crc32_of(path / name, want.size)
        except (OSError, ValueError) as exc:  # UntrustedFileError: not a regular file
            return f"{name} unreadable: {exc}"
        if crc != want.crc32:
            return f"{name} checksum {crc} differs from the commit marker's {want.crc32}"
    return None


def _unsafe_metadata(path: Path, files: Mapping[str, FileRecord]) -> str | None:
    """Why DCP's metadata file is refused; a CRC is no authentication, so it is read as
    untrusted input (`load_checkpoint_metadata`), and the data it points DCP at must be
    the marker's listed files, within their sizes."""
    try:
        metadata = load_checkpoint_metadata(path / _DCP_METADATA)
        storage = metadata.storage_data
        if not isinstance(storage, Mapping):
            return f"{_DCP_METADATA} refused: it gives no data locations"
        problem = storage_problem(storage, {name: f.size for name, f in files.items()})
        if problem is not None:
            return f"{_DCP_METADATA} refused: {problem}"
    except UnsafeCheckpointError as exc:
        return f"{_DCP_METADATA} refused: {exc}"
    except Exception as exc:
        return f"{_DCP_METADATA} unreadable: {type(exc).__name__}: {exc}"
    return None
