"""The local inductor directory: where inductor works in this process, what of it an entry
archives, and how a restored archive joins it.

The default base, `$TMPDIR/airflow-ett-inductor-<uid>`, is per user and must be private
(`not_private`): inductor loads the `.so` files it finds there, so a directory another
user can write is never used. Lock files and inductor's in-flight temp files are not
archived (per host and process). A restored tree is merged file by file, each an atomic
rename, keeping files already there: another rank or an earlier attempt on this host may
be using them.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: Inductor-dir entries never archived: lock files are per host and process.
SKIP_TOP_LEVEL = frozenset({"locks"})


def default_local_base() -> Path:
    """Per user: `$TMPDIR` is shared by every user of the host, and inductor loads the
    `.so` files it finds in its cache dir."""
    return Path(tempfile.gettempdir()).absolute() / f"airflow-ett-inductor-{os.geteuid()}"


def not_private(base: Path) -> str | None:
    """Why `base` (created 0o700 when missing) cannot hold this user's inductor dirs: a
    symlink, another owner, or writable by group or others. None when it is private."""
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700, parents=True)
    st = base.lstat()
    if not os.path.isdir(base) or os.path.islink(base):
        return f"local inductor dir base {base} is not a plain directory"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return (f"local inductor dir base {base} is not private to this user (owner uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    return None


def walk_local(local: Path) -> Iterator[tuple[Path, str]]:
    """Files and dirs of the inductor dir worth archiving, with their archive names.

    Skips lock files (per host) and inductor's in-flight temp files (hidden `*.tmp`).
    """
    for dirpath, dirnames, filenames in os.walk(local):
        rel = Path(dirpath).relative_to(local)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in SKIP_TOP_LEVEL]
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".tmp") or name.endswith(".lock"):
                continue
            path = Path(dirpath) / name
            if path.is_symlink():
                continue
            yield path, str(rel / name)


def merge_into(staging: Path, local: Path) -> None:
    """Move the unpacked tree into `local`: one rename when `local` is empty, otherwise
    file by file, each an atomic rename, keeping files already there (another rank or an
    earlier attempt on this host may be using them)."""
    with contextlib.suppress(OSError):
        local.rmdir()  # only succeeds when empty
    if not local.exists():
        try:
            os.rename(staging, local)
            staging.mkdir()  # the caller removes it
            return
        except OSError:
            pass  # lost a race with another restorer: merge instead
    local.mkdir(parents=True, exist_ok=True)
    for dirpath, _dirnames, filenames in os.walk(staging):
        rel = Path(dirpath).relative_to(staging)
        target_dir = local / rel
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            target = target_dir / name
            if not target.exists():
                os.replace(Path(dirpath) / name, target)


def pack(local: Path, fh: IO[bytes]) -> tuple[int, int]:
    """Write what `walk_local` yields of `local` to `fh` as a gzip'd tar; returns the number
    of files and their unpacked bytes."""
    file_count = 0
    unpacked = 0
    with tarfile.open(fileobj=fh, mode="w:gz", compresslevel=1) as tar:
        for path, arcname in walk_local(local):
            try:
                tar.add(path, arcname=arcname, recursive=False)
            except FileNotFoundError:  # removed while we walked; not needed
                continue
            file_count += 1
            with contextlib.suppress(OSError):
                unpacked += path.stat().st_size
    return file_count, unpacked
