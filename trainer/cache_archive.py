"""Reading a compile-cache archive that may be damaged or hostile, in two layers.

`open_archive` bounds the headers as tarfile parses them. tarfile reads some headers
whole into memory while it lists the members: a GNU long name or long link (`L`/`K`) or
a pax header (`x`/`g`/`X`) is a "member" whose data is the header, read in one
`read(size)`; an old GNU sparse member (`S`) reads a chain of extension blocks as long as
the archive. A 509 KB gzip whose tar holds one 512 MB `L` header cost 4.5 GB before the
first member check ran. Each header is looked at in `_BoundedTarInfo._proc_member` (the
one place every header passes through, tarfile's own dispatch, unchanged from 3.11.0 to
3.13: a test runs a crafted archive through it on this Python), and one of those kinds
larger than `MAX_HEADER_BYTES` is refused before its data is read; sparse members are
refused outright (the cache never writes them).

`safe_extract` then checks every member before writing any: only regular files,
directories and links that stay inside the destination; no absolute names, no `..`, no
devices or fifos, no setuid/setgid bits, bounded member count and sizes. The checks are
ours, not tarfile's extraction filters, which arrived in Python 3.11.4 (Debian 12 ships
3.11.2, where `extractall(filter=...)` is a TypeError); where the filter exists it runs
too. This keeps a corrupt or careless archive from writing outside the cache dir; it does
not make an entry trustworthy (the compile cache's `__init__`, docs/security.md).
"""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

#: A pax or long-name header is a path or a few attributes: inductor's file names are
#: under 300 bytes. Past this a header is not one of ours.
MAX_HEADER_BYTES: Final = 64 << 10
_HEADER_TYPES: Final = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
                        tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
#: Bounds on one archive restore (a damaged or hostile archive must not fill the disk);
#: far above what an inductor cache dir holds, so only a broken archive reaches them.
MAX_ARCHIVE_MEMBERS = 200_000
MAX_MEMBER_BYTES = 4 << 30
MAX_ARCHIVE_BYTES = 32 << 30
#: Whether this Python's tarfile has extraction filters (3.11.4+). Checked once; tests
#: set it False to run the path Debian 12's Python 3.11.2 takes.
_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


class UnsafeArchiveError(ValueError):
    """An archive member that must not be extracted; the message names it and why."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A `TarInfo` that refuses an oversize extended header, or a sparse member, before
    tarfile reads what follows it."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise UnsafeArchiveError(
                f"a {self.type.decode(errors='replace')!r} header of {self.size:,} bytes "
                f"(extended headers are at most {MAX_HEADER_BYTES:,})")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchiveError(f"member {self.name!r}: a sparse file")
        # tarfile's private hook (what `tarfile.open` calls per header): not in typeshed
        member: tarfile.TarInfo = super()._proc_member(tarfile_)  # type: ignore[misc]
        return member


def open_archive(path: Path) -> tarfile.TarFile:
    """The gzip'd tar at `path` opened for reading with bounded headers (module
    docstring); raises `UnsafeArchiveError` for a refused header, tarfile's errors for
    one that is not a tar."""
    return tarfile.open(path, mode="r:gz", tarinfo=_BoundedTarInfo)


def safe_extract(
    tar: tarfile.TarFile,
    dest: str | Path,
    *,
    max_members: int = MAX_ARCHIVE_MEMBERS,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int = MAX_ARCHIVE_BYTES,
) -> int:
    """Extract `tar` into the directory `dest` after checking every member; returns the
    number of members. Raises `UnsafeArchiveError` (nothing written) when one is refused.

    The checks are ours, the same on every Python 3.11.x, and all done before the first
    byte is written, so a refused archive leaves `dest` as it was. Refused: absolute
    names, `..` components, duplicate names, anything but regular files, directories,
    symlinks and hardlinks (devices, fifos), setuid/setgid/sticky bits, links whose
    target (resolved through the archive's own symlinks) leaves `dest`, hardlinks to
    anything but a regular file of the archive, members above `max_member_bytes`,
    more than `max_members` members or `max_total_bytes` in all. Accepted members are
    extracted with the attributes tarfile's "data" filter would give them (no owner, mode
    limited to 0o755, owner read/write on files), and where the filter exists (3.11.4+) it
    runs too, as a second line.
    """
    dest = Path(dest)
    checked: list[tarfile.TarInfo] = []
    seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
    links: dict[tuple[str, ...], str] = {}
    total = 0
    for member in tar:  # lazily: a huge member count is refused before it is all read
        if len(checked) >= max_members:
            raise UnsafeArchiveError(f"more than {max_members} members")
        parts = _member_parts(member.name)
        what = f"member {member.name!r}"
        if parts in seen:
            raise UnsafeArchiveError(f"{what}: appears twice")
        _check_member_kind(member, what, max_member_bytes)
        total += member.size
        if total > max_total_bytes:
            raise UnsafeArchiveError(f"more than {max_total_bytes} bytes in all at {what}")
        seen[parts] = member
        if member.issym():
            links[parts] = member.linkname
        checked.append(member)
    for member in checked:
        _check_placement(member, seen, links)
    safe = [_data_attrs(member) for member in checked]
    if _HAS_DATA_FILTER:
        tar.extractall(dest, members=safe, numeric_owner=True, filter="data")
    else:
        tar.extractall(dest, members=safe, numeric_owner=True)
    return len(safe)


def _check_member_kind(member: tarfile.TarInfo, what: str, max_member_bytes: int) -> None:
    """Refuses a member by itself: special files, setuid/setgid/sticky bits, oversize."""
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveError(f"{what}: not a regular file, directory or link "
                                 f"(device, fifo or other special file)")
    if member.mode & 0o7000:
        raise UnsafeArchiveError(f"{what}: setuid/setgid/sticky mode {member.mode:o}")
    if member.size > max_member_bytes:
        raise UnsafeArchiveError(f"{what}: {member.size} bytes, over {max_member_bytes}")


def _member_parts(name: str, label: str = "member") -> tuple[str, ...]:
    """A member name (or a hardlink's target) as path parts; refuses absolute names and
    `..`."""
    what = f"{label} {name!r}"
    if not name or "\x00" in name:
        raise UnsafeArchiveError(f"{what}: empty name or NUL byte")
    if name.startswith(("/", os.sep)) or os.path.isabs(name):
        raise UnsafeArchiveError(f"{what}: absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchiveError(f"{what}: '..' component")
    if not parts:
        raise UnsafeArchiveError(f"{what}: names the destination itself")
    return parts


def _resolve(parts: tuple[str, ...], links: Mapping[tuple[str, ...], str]) -> tuple[str, ...]:
    """Where `parts` lands under the destination, following the archive's own symlinks as
    the filesystem would once they are extracted; raises when it would leave it."""
    out: list[str] = []
    todo = list(parts)
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise UnsafeArchiveError("resolves outside the destination")
            out.pop()
            continue
        out.append(part)
        target = links.get(tuple(out))
        if target is not None:
            hops += 1
            if hops > 40:
                raise UnsafeArchiveError("symlink loop")
            if target.startswith(("/", os.sep)) or os.path.isabs(target):
                raise UnsafeArchiveError(f"goes through a symlink to the absolute {target!r}")
            out.pop()
            todo = [*target.split("/"), *todo]
    return tuple(out)


def _check_placement(
    member: tarfile.TarInfo,
    seen: Mapping[tuple[str, ...], tarfile.TarInfo],
    links: Mapping[tuple[str, ...], str],
) -> None:
    """The member's directory, and a link's target, stay inside the destination."""
    parts = _member_parts(member.name)
    what = f"member {member.name!r}"
    try:
        _resolve(parts[:-1], links)
        if member.issym():
            if member.linkname.startswith(("/", os.sep)) or os.path.isabs(member.linkname):
                raise UnsafeArchiveError(f"symlink to the absolute {member.linkname!r}")
            _resolve((*parts[:-1], *member.linkname.split("/")), links)
        elif member.islnk():
            target = _member_parts(member.linkname, "hardlink to")
            if _resolve(target, links) != target or not (
                target in seen and seen[target].isreg()
            ):
                raise UnsafeArchiveError(
                    f"hardlink to {member.linkname!r}, not a regular file of the archive"
                )
    except UnsafeArchiveError as exc:
        raise UnsafeArchiveError(f"{what}: {exc}") from None


def _data_attrs(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A copy with the attributes tarfile's "data" filter gives (3.11.4+), set by hand so
    that 3.11.2 extracts the same: no owner, mode limited to 0o755, files owner-rw."""
    safe = copy.copy(member)
    mode = member.mode & 0o755
    if member.isreg() or member.islnk():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    elif member.isdir():
        mode = 0o755
    safe.mode = mode
    safe.uid, safe.gid = os.geteuid(), os.getegid()
    safe.uname = safe.gname = ""
    return safe
