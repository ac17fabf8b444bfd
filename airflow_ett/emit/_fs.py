"""File-system helpers shared by the spool and the file sink."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes) -> None:
    """`os.write` may write less than asked (signals, quotas); loop until all is out."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or create in `path` survive a power cut, not only the file's data."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
