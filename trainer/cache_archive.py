"""Opening a compile-cache archive with its headers bounded before tarfile expands them.

`safe_extract` (compile_cache.py) checks every member before writing one, but tarfile
itself reads some headers whole into memory while it lists the members: a GNU long name
or long link (`L`/`K`) or a pax header (`x`/`g`/`X`) is a "member" whose data is the
header, read in one `read(size)`; an old GNU sparse member (`S`) reads a chain of
extension blocks as long as the archive. A 509 KB gzip whose tar holds one 512 MB `L`
header cost 4.5 GB before the first member check ran. Here each header is looked at as
tarfile parses it (`_BoundedTarInfo._proc_member`, the one place every header passes
through), and one of those kinds larger than `MAX_HEADER_BYTES` is refused before its
data is read; sparse members are refused outright (the cache never writes them).

`_proc_member` is tarfile's own dispatch, unchanged from 3.11.0 to 3.13: a test runs a
crafted archive through it on this Python, so a change in tarfile shows as a failure.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any, Final

#: A pax or long-name header is a path or a few attributes: inductor's file names are
#: under 300 bytes. Past this a header is not one of ours.
MAX_HEADER_BYTES: Final = 64 << 10
_HEADER_TYPES: Final = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
                        tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class UnsafeArchiveError(ValueError):
    """An archive member that must not be extracted; the message names it and why."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A `TarInfo` that refuses an oversize extended header, or a sparse member, before
    tarfile reads what follows it."""

    def _proc_member(self, tarfile_: Any) -> Any:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise UnsafeArchiveError(
                f"a {self.type.decode(errors='replace')!r} header of {self.size:,} bytes "
                f"(extended headers are at most {MAX_HEADER_BYTES:,})")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchiveError(f"member {self.name!r}: a sparse file")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def open_archive(path: Path) -> tarfile.TarFile:
    """The gzip'd tar at `path` opened for reading with bounded headers (module
    docstring); raises `UnsafeArchiveError` for a refused header, tarfile's errors for
    one that is not a tar."""
    return tarfile.open(path, mode="r:gz", tarinfo=_BoundedTarInfo)
