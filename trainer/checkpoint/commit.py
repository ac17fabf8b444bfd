"""Writing a checkpoint and committing it: step directories and their commit marker.

A checkpoint counts only when complete. DCP writes into `<dir>/.tmp-step-<step>-<token>/`
with `sync_files=True` (every data file and `.metadata` fsynced; `write_step`). Then the
coordinator (rank 0 of the checkpoint group) fsyncs that directory, renames it to
`<dir>/step-<step:010d>/` (atomic on one filesystem), fsyncs `<dir>`, and writes the
commit marker `COMMITTED.json` LAST (`marker.write_marker`: temp file, fsync, rename,
fsync; `commit_step`). The marker (`marker.CommitMarker`) holds step, `extra` (the
caller's small JSON metadata: data cursor, RNG states...; rank 0's, plus every rank's
when they differ), bytes, times and the size and CRC32 of every DCP file. A crash at any
point leaves either an unrenamed temp directory or a step directory without a marker, and
neither is ever restored (`marker.read_marker`).

The directory must be one filesystem shared by all ranks (DCP's `FileSystemWriter`
assumes it too: the coordinator renames the directory all ranks wrote into). Each rank
checksums its own data files (`describe_mine`: DCP names them `__<rank>_<n>.distcp`) and
the coordinator gathers the lists into the marker, so that work is spread like the write.
After a commit the coordinator keeps the newest `keep_last` (`retain`) and removes what
crashed saves left behind (`remove_stale`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import zlib
from pathlib import Path
from typing import TypeAlias

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from airflow_ett._fs import fsync_dir
from airflow_ett.trainer.checkpoint.coord import _Coord
from airflow_ett.trainer.checkpoint.marker import (
    COMMIT_MARKER,
    CommitMarker,
    FileRecord,
    JsonObject,
    _step_of,
    read_marker,
    step_dir_name,
    write_marker,
)
from airflow_ett.trainer.checkpoint.results import CheckpointError, StateDict

log = logging.getLogger("airflow_ett.trainer.checkpoint")

#: What a rank hands the coordinator for the commit: its files' records (or why it cannot
#: commit: a string) and its `extra` as JSON text.
Described: TypeAlias = dict[str, FileRecord] | str
Gathered: TypeAlias = list[tuple[Described, str]]

_TMP_DIR = re.compile(r"^\.tmp-step-(\d+)-[A-Za-z0-9_.-]+$")
_DCP_METADATA = ".metadata"
_CHUNK = 8 * 1024 * 1024


# -- names ------------------------------------------------------------------------------


def tmp_dir_name(step: int, token: str, seq: int) -> str:
    """Where a save writes before its commit: the manager's `token` (agreed by all ranks)
    and its `seq` (one per save) keep two saves, or two processes, apart."""
    return f".tmp-step-{step:010d}-{token}-{seq}"


def step_dirs(directory: Path) -> list[Path]:
    """Step directories, newest first."""
    try:
        entries = [Path(e.path) for e in os.scandir(directory) if e.is_dir()]
    except FileNotFoundError:
        return []
    steps = [(s, p) for p in entries if (s := _step_of(p)) is not None]
    return [p for _, p in sorted(steps, reverse=True)]


def latest_committed(directory: Path) -> Path | None:
    """The newest step directory whose marker is present and readable (no checksums)."""
    for path in step_dirs(directory):
        try:
            read_marker(path)
        except (OSError, ValueError):
            continue
        return path
    return None


# -- writing -----------------------------------------------------------------------------


def _crc32(path: Path) -> tuple[int, str]:
    """Size and CRC32 of a file (zlib releases the GIL on big chunks: cheap for training)."""
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(view):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, f"{crc:08x}"


def _describe(directory: Path, names: list[str]) -> dict[str, FileRecord]:
    out: dict[str, FileRecord] = {}
    for name in names:
        size, crc = _crc32(directory / name)
        out[name] = FileRecord(size=size, crc32=crc)
    return out


def write_step(
    coord: _Coord, step: int, state: StateDict, tmp: Path, write_threads: int
) -> None:
    """DCP's save into `tmp` (a collective); on failure the coordinator removes `tmp`."""
    try:
        writer = FileSystemWriter(tmp, sync_files=True, thread_count=write_threads)
        dcp_save(
            state, storage_writer=writer, process_group=coord.group, no_dist=coord.group is None
        )
    except BaseException as exc:
        if coord.is_coordinator:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"checkpoint step {step}: DCP save failed: {exc}") from exc


def describe_mine(coord: _Coord, tmp: Path) -> Described:
    """Sizes and checksums of this rank's files, or why they cannot be read: a string,
    not an exception, because every rank must still reach the gather."""
    try:
        prefix = f"__{coord.rank}_"
        mine = sorted(n for n in os.listdir(tmp) if n.startswith(prefix))
        return _describe(tmp, mine)
    except OSError as exc:
        return f"rank {coord.rank}: {exc}"


# -- the commit --------------------------------------------------------------------------


def commit_step(
    directory: Path,
    token: str,
    world_size: int,
    step: int,
    tmp: Path,
    gathered: Gathered,
    extra_json: str,
    t0: float,
    blocking: float | None,
) -> tuple[int, float]:
    """Coordinator: checksum what no rank did, rename into place, write the marker."""
    files: dict[str, FileRecord] = {}
    extras = [_json_object(e) for _, e in gathered]
    for rank, (described, _) in enumerate(gathered):
        if isinstance(described, str):
            raise CheckpointError(f"not committed: {described}")
        if not isinstance(described, dict):
            raise CheckpointError(f"rank {rank} sent no file list")
        files.update(described)
    rest = sorted(n for n in os.listdir(tmp) if n not in files)
    files.update(_describe(tmp, rest))
    if _DCP_METADATA not in files:
        raise CheckpointError(f"DCP wrote no {_DCP_METADATA} in {tmp}")
    fsync_dir(tmp)
    final = directory / step_dir_name(step)
    replaced: Path | None = None
    if final.exists():  # an older attempt's checkpoint of this step (maybe invalid)
        replaced = directory / f".tmp-step-{step:010d}-{token}-replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
        log.warning("checkpoint %s exists: replacing it", final)
    os.rename(tmp, final)
    fsync_dir(directory)
    size = sum(f.size for f in files.values())
    total = time.perf_counter() - t0
    write_marker(final, CommitMarker(
        step=step,
        extra=_json_object(extra_json),
        # Only when ranks differ (per-rank RNG states, say): restore hands each rank
        # its own; "extra" stays rank 0's, what discovery reads.
        rank_extras=tuple(extras) if any(e != extras[0] for e in extras) else None,
        bytes=size,
        blocking_s=blocking if blocking is not None else total,
        total_s=total,
        time=time.time(),
        world_size=world_size,
        torch=torch.__version__,
        files=files,
    ))
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return size, total


def _json_object(text: str) -> JsonObject:
    """A rank's `extra`, JSON text that `CheckpointManager.save` made of a dict."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise CheckpointError(f"extra is not a JSON object: {text[:80]!r}")
    return value


# -- retention ---------------------------------------------------------------------------


def retain(directory: Path, keep_last: int, live_tmp: set[Path]) -> None:
    """Coordinator, after a commit: keep the newest `keep_last` committed checkpoints;
    drop uncommitted step directories and stale temp directories older than the
    newest commit. Failures here are logged, never raised: the save did commit."""
    try:
        committed: list[Path] = []
        for path in step_dirs(directory):
            try:
                read_marker(path)
            except (OSError, ValueError):
                if committed:  # older than a commit: a save that never committed
                    log.info("removing uncommitted checkpoint %s", path)
                    shutil.rmtree(path, ignore_errors=True)
                continue
            committed.append(path)
        if keep_last:
            for path in committed[keep_last:]:
                log.info("retention: removing checkpoint %s", path)
                shutil.rmtree(path, ignore_errors=True)
        remove_stale(directory, live_tmp)
    except OSError as exc:
        log.warning("checkpoint retention in %s failed: %s", directory, exc)


def remove_stale(directory: Path, live_tmp: set[Path]) -> None:
    """Temp directories left by crashed saves: only those of a step no newer than the
    newest commit and last modified before it (a newer one may belong to a live save
    of another process, e.g. a trainer still running beside a publish step), and
    never one this process is writing (`live_tmp`)."""
    newest = latest_committed(directory)
    if newest is None:
        return
    newest_step = _step_of(newest)
    assert newest_step is not None
    try:
        committed_at = (newest / COMMIT_MARKER).stat().st_mtime
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        m = _TMP_DIR.match(entry.name)
        path = Path(entry.path)
        if not m or path in live_tmp or int(m.group(1)) > newest_step:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= committed_at:
                continue
        except OSError:
            continue
        log.info("removing stale checkpoint temp directory %s", path)
        shutil.rmtree(path, ignore_errors=True)
