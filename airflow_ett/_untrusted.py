"""The package's one way to read a file that another process or person wrote.

Tenants and components files, preemption requests, trainer configs, checkpoint markers and
metadata, compile-cache archives and events files are written by someone the reader does
not control (docs/security.md). Read through here, such a file costs the reader a bounded
amount of time and memory, and anything wrong with it is one `UntrustedFileError`: a
`ValueError` whose message is one line naming what was read, the path and why.

- Only a regular file is read. The path is opened with `O_NONBLOCK` (a FIFO without a
  writer would block `open` itself) and its type is taken from the open descriptor
  (`fstat`), so a FIFO, a socket, a directory or a device such as `/dev/zero`, directly
  or behind a symlink, is refused before a byte is read, with no window between check
  and read.
- At most `max_bytes` are read (one byte more tells that the file is larger).
- Text is UTF-8 (a leading byte-order mark is dropped); the error names the byte offset.
- A missing file is `MissingFileError`, a subclass, for readers to whom none is an answer.
- Parsed JSON and TOML nested deeper than `max_depth` are refused, including the nesting
  that would make the parser itself run out of stack (its `RecursionError` is this error).

Stdlib only: the trainer, the scheduling rules and the rollup all import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

#: Nesting allowed in a parsed configuration or request: ours are at most four deep.
DEFAULT_MAX_DEPTH: Final = 32

_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class UntrustedFileError(ValueError):
    """A file that cannot be used as it is; `str()` is one line (what, path, reason)."""

    def __init__(self, what: str, path: str | os.PathLike[str], reason: str) -> None:
        self.what = what
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{what} {self.path}: {reason}")


class MissingFileError(UntrustedFileError):
    """Nothing at the path: for readers to whom "none" is an ordinary answer."""


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _opened(path: Path, what: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MissingFileError(what, path, "not found") from None
    except OSError as exc:
        with contextlib.suppress(OSError):  # a socket cannot be opened at all: say what it is
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(what, path, mode) from None
        raise UntrustedFileError(what, path, f"cannot be read: {exc.strerror or exc}") from None


def _not_regular(what: str, path: Path, mode: int) -> UntrustedFileError:
    kind = _kind(mode)
    return UntrustedFileError(what, path, kind if kind.startswith("not")
                              else f"not a regular file ({kind})")


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], *, what: str) -> Iterator[BinaryIO]:
    """`path` opened for binary reading, only if it is a regular file (module docstring).

    The descriptor is put back in blocking mode once its type is known, so reads behave
    as usual. `size = os.fstat(fh.fileno()).st_size` is the size the file had then.
    """
    file = Path(path)
    fd = _opened(file, what)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(what, file, mode)
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh


def read_limited(fh: BinaryIO, *, max_bytes: int, what: str,
                 path: str | os.PathLike[str]) -> bytes:
    """All of `fh` from where it stands, or the error when that is over `max_bytes`."""
    try:
        data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise UntrustedFileError(what, path, f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise UntrustedFileError(what, path, f"larger than its limit of {max_bytes:,} bytes")
    return data


def read_bytes(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """The whole regular file at `path`, at most `max_bytes` long."""
    with open_regular(path, what=what) as fh:
        return read_limited(fh, max_bytes=max_bytes, what=what, path=path)


def decode_text(data: bytes, *, what: str, path: str | os.PathLike[str]) -> str:
    """`data` as UTF-8 text without a leading byte-order mark."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedFileError(
            what, path, f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})"
        ) from None
    return text.removeprefix("\ufeff")


def read_text(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> str:
    """The regular file at `path` as UTF-8 text, at most `max_bytes` bytes long."""
    return decode_text(read_bytes(path, what=what, max_bytes=max_bytes), what=what, path=path)


def nesting_depth(value: object, *, stop_after: int) -> int:
    """How deep dicts and lists nest in `value` (a scalar is 0, `[]` is 1), counted without
    recursion and only up to `stop_after + 1` (deeper is not looked at)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] | tuple[object, ...] = tuple(item.values())
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth > stop_after:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def check_depth(value: object, *, what: str, path: str | os.PathLike[str],
                max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    if nesting_depth(value, stop_after=max_depth) > max_depth:
        raise UntrustedFileError(what, path, f"nested deeper than {max_depth} levels")


def _too_deep(what: str, path: str | os.PathLike[str], max_depth: int) -> UntrustedFileError:
    return UntrustedFileError(what, path, f"nested deeper than {max_depth} levels")


def parse_json(data: bytes | str, *, what: str, path: str | os.PathLike[str],
               max_depth: int = DEFAULT_MAX_DEPTH) -> object:
    """JSON text as Python values (dicts, lists, str, int, float, bool, None), read as the
    standard library reads it (`NaN` and `Infinity` included: the reader's range checks
    name such a value, which is clearer than a syntax error)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep(what, path, max_depth) from None
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8
        raise UntrustedFileError(what, path, f"not valid JSON: {exc}") from None
    check_depth(value, what=what, path=path, max_depth=max_depth)
    return value


def parse_toml(text: str, *, what: str, path: str | os.PathLike[str],
               max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, object]:
    """TOML text as a dict of Python values."""
    try:
        value = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(what, path, max_depth) from None
    except tomllib.TOMLDecodeError as exc:
        raise UntrustedFileError(what, path, f"not valid TOML: {exc}") from None
    check_depth(value, what=what, path=path, max_depth=max_depth)
    return value


def load_json(path: str | os.PathLike[str], *, what: str, max_bytes: int,
              max_depth: int = DEFAULT_MAX_DEPTH) -> object:
    """The regular file at `path` as JSON, bounded in size and depth."""
    text = read_text(path, what=what, max_bytes=max_bytes)
    return parse_json(text, what=what, path=path, max_depth=max_depth)


def load_toml(path: str | os.PathLike[str], *, what: str, max_bytes: int,
              max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, object]:
    """The regular file at `path` as TOML, bounded in size and depth."""
    text = read_text(path, what=what, max_bytes=max_bytes)
    return parse_toml(text, what=what, path=path, max_depth=max_depth)
