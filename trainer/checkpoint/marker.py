"""The commit marker `COMMITTED.json`: what makes a step directory a checkpoint.

`CommitMarker` is the marker as the package uses it; `write_marker` (the commit's, the
coordinator's alone) is its one writer and `read_marker` its one reader. The JSON keeps
the layout it always had (`MARKER_FORMAT` 1): `format`, `step`, `extra` (the caller's JSON
object: rank 0's), `rank_extras` (every rank's, only when they differ), `bytes`,
`blocking_s`, `total_s`, `time`, `world_size`, `torch`, and `files`, each DCP file's
`size` and `crc32`.

Whoever can write the checkpoint directory can write a marker, so `read_marker` reads it
as untrusted input: bounded in size and depth (`files.load_marker`), then every field
checked for its type before a `CommitMarker` is built. Anything wrong is one
`ValueError` whose message is one line naming the field and its value; restore then
treats the directory as no valid checkpoint and falls back to an older one.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias, TypeGuard

from airflow_ett._fs import atomic_write
from airflow_ett.trainer.checkpoint.files import load_marker

COMMIT_MARKER: Final = "COMMITTED.json"
MARKER_FORMAT: Final = 1
_STEP_DIR: Final = re.compile(r"^step-(\d{10})$")
_CRC32: Final = re.compile(r"[0-9a-f]{8}")

#: A JSON object as `json` reads it: what `extra` is. The package only carries it; the
#: caller that wrote it reads what it put there.
JsonObject: TypeAlias = dict[str, object]


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file of a checkpoint as its marker lists it."""

    size: int
    crc32: str  # 8 lowercase hex digits


@dataclass(frozen=True, slots=True)
class CommitMarker:
    """A checkpoint's commit marker (module docstring).

    `extra` is rank 0's (what discovery reads: cursor, step); `rank_extras` every rank's
    in rank order, only when ranks saved different ones (None otherwise). `files` maps
    each DCP file name to its size and CRC32. `blocking_s`, `total_s` and `bytes` are the
    save's figures (`SaveResult`), `time` the commit's wall-clock time."""

    step: int
    extra: JsonObject
    files: dict[str, FileRecord]
    bytes: int
    blocking_s: float
    total_s: float
    time: float
    world_size: int
    torch: str
    rank_extras: tuple[JsonObject, ...] | None = None
    format: int = MARKER_FORMAT


def step_dir_name(step: int) -> str:
    """`step-0000000042`: zero-padded so names sort like steps."""
    return f"step-{step:010d}"


def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


# -- the writer ----------------------------------------------------------------------------


def write_marker(step_dir: Path, marker: CommitMarker) -> None:
    """Write `marker` into the step directory, atomically (temp file, fsync, rename,
    fsync): the commit's last act."""
    doc: dict[str, object] = {
        "format": marker.format,
        "step": marker.step,
        "extra": marker.extra,
        "bytes": marker.bytes,
        "blocking_s": marker.blocking_s,
        "total_s": marker.total_s,
        "time": marker.time,
        "world_size": marker.world_size,
        "torch": marker.torch,
        "files": {name: {"size": f.size, "crc32": f.crc32} for name, f in marker.files.items()},
    }
    if marker.rank_extras is not None:
        doc["rank_extras"] = list(marker.rank_extras)
    atomic_write(step_dir / COMMIT_MARKER, json.dumps(doc, indent=1, sort_keys=True).encode())


# -- the reader ----------------------------------------------------------------------------


def read_marker(step_dir: Path) -> CommitMarker:
    """The commit marker of a step directory; raises ValueError (one line naming the field
    and its value) or OSError when it is unusable. No checksums: `integrity` checks the
    files against it."""
    loaded = load_marker(step_dir / COMMIT_MARKER)  # bounded: a ValueError when it is not
    if not isinstance(loaded, dict):
        raise ValueError("commit marker is not a JSON object")
    raw: JsonObject = loaded
    step = _step_of(step_dir)
    said = raw.get("step")
    if not _is_int(said) or said != step:
        raise ValueError(f"commit marker says step {_show(said)}, directory {step}")
    fmt = raw.get("format")
    if fmt != MARKER_FORMAT or not _is_int(fmt):
        raise ValueError(f"commit marker: format is {_show(fmt)}, this trainer reads "
                         f"{MARKER_FORMAT}")
    files, extra = raw.get("files"), raw.get("extra")
    if not isinstance(files, dict) or not isinstance(extra, dict):
        raise ValueError("commit marker lacks its file list or extra")
    return CommitMarker(
        step=said,
        extra=extra,
        files={name: _file_record(name, record) for name, record in files.items()},
        bytes=_count(raw, "bytes"),
        blocking_s=_seconds(raw, "blocking_s"),
        total_s=_seconds(raw, "total_s"),
        time=_seconds(raw, "time"),
        world_size=_world_size(raw),
        torch=_text(raw, "torch"),
        rank_extras=_rank_extras(raw.get("rank_extras")),
        format=fmt,
    )


def _show(value: object) -> str:
    """A value for an error message: its repr, cut to one short line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: object) -> TypeGuard[int]:
    """An integer, not a bool (JSON's `true` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _count(raw: JsonObject, name: str) -> int:
    value = raw.get(name)
    if not _is_int(value) or value < 0:
        raise ValueError(f"commit marker: {name} is {_show(value)}, not a count >= 0")
    return value


def _world_size(raw: JsonObject) -> int:
    size = _count(raw, "world_size")
    if size < 1:
        raise ValueError(f"commit marker: world_size is {size}, not >= 1")
    return size


def _seconds(raw: JsonObject, name: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"commit marker: {name} is {_show(value)}, not a number of seconds")
    return float(value)


def _text(raw: JsonObject, name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise ValueError(f"commit marker: {name} is {_show(value)}, not a string")
    return value


def _file_record(name: str, record: object) -> FileRecord:
    """A `files` entry; its name is checked against the directory by `integrity`."""
    where = f"commit marker: files[{_show(name)}]"
    if not isinstance(record, dict):
        raise ValueError(f"{where} is {_show(record)}, not an object with size and crc32")
    size, crc = record.get("size"), record.get("crc32")
    if not _is_int(size) or size < 0:
        raise ValueError(f"{where}.size is {_show(size)}, not a size in bytes")
    if not isinstance(crc, str) or not _CRC32.fullmatch(crc):
        raise ValueError(f"{where}.crc32 is {_show(crc)}, not 8 hex digits")
    return FileRecord(size=size, crc32=crc)


def _rank_extras(value: object) -> tuple[JsonObject, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise ValueError(f"commit marker: rank_extras is {_show(value)}, not a list of "
                         "JSON objects")
    return tuple(value)
