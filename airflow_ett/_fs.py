"""The package's one atomic file write and its one directory fsync.

Stdlib only (no Airflow, no torch): the emitter's spool, the trainer's checkpoints,
compile cache and published models all write through here, and the trainer must never
import Airflow.

Contract of `atomic_file` / `atomic_write`: a reader of the target sees the old file or
the new one, whole, never a part, because the data goes to a hidden temp file beside the
target (same directory, so the same filesystem and an atomic rename) and is renamed over
it only once written and fsynced. Once the call returns, the rename is durable too: the
directory is fsynced after it. When the write fails the temp file is removed and the
target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


def write_all(fd: int, data: bytes) -> None:
    """`os.write` may write less than asked (signals, quotas); loop until all is out."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(path: str | os.PathLike[str], *, best_effort: bool = False) -> None:
    """Make a rename or create in directory `path` survive a power cut, not only the
    file's data. `best_effort`: ignore an OSError (some network filesystems refuse
    directory descriptors), for writers whose files are a cache that may be lost."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not best_effort:
            raise


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a file someone else wrote (a library that takes a path, not a handle)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_sibling(path: Path, suffix: str = ".tmp") -> Path:
    """`.<name>.<random><suffix>` beside `path`: hidden, never reused, same filesystem."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}{suffix}")


@dataclass(slots=True)
class AtomicFile:
    """What `atomic_file` yields: the open temp file, and where it will land.

    `path` may be re-pointed before the block ends, within the same directory, for files
    named by their content (a hash known only once everything is written).
    """

    file: BinaryIO
    path: Path


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    *,
    mode: int = 0o666,
    suffix: str = ".tmp",
    best_effort_dir_sync: bool = False,
) -> Iterator[AtomicFile]:
    """Write `path` whole or not at all (see the module docstring).

    `mode` is that of `os.open` (the umask applies, as for `open`); `suffix` ends the temp
    file's name, so a directory's own cleanup rules can recognise its leftovers after a
    crash; `best_effort_dir_sync` as in `fsync_dir`.
    """
    target = Path(path)
    tmp = temp_sibling(target, suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            out = AtomicFile(fh, target)
            yield out
            fh.flush()
            os.fsync(fh.fileno())
        if out.path.parent != target.parent:
            raise ValueError(f"atomic_file: {out.path} is not in {target.parent}: the rename "
                             "would not be atomic")
        os.replace(tmp, out.path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(target.parent, best_effort=best_effort_dir_sync)


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o666,
    suffix: str = ".tmp",
    best_effort_dir_sync: bool = False,
) -> None:
    """`data` as the whole content of `path`, atomically and durably (`atomic_file`)."""
    with atomic_file(path, mode=mode, suffix=suffix,
                     best_effort_dir_sync=best_effort_dir_sync) as out:
        out.file.write(data)
