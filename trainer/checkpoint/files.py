"""A checkpoint's files read as untrusted input: bounded in size, type and work.

A checkpoint directory is written by the trainer, but whoever else can write it (the
shared `work_dir`: docs/security.md) must not be able to hang or exhaust a restore. Restore
reads three kinds of file, and each is bounded here before the package uses it:

- the commit marker (`COMMITTED.json`): a regular file of at most `MAX_MARKER_BYTES`,
  JSON nested at most `_MARKER_DEPTH` deep;
- the files the marker lists: each a plain name inside the directory (no `/`, no `..`)
  naming a regular file there, never a symlink, a FIFO or a device (a marker listing
  `/dev/zero` made the checksum read forever); checksummed up to the size the marker
  states and no further;
- DCP's `.metadata` pickle: a regular file of at most `MAX_METADATA_BYTES`, whose opcodes
  are walked (`pickle_work`) before it is unpickled, so that a pickle cannot make more
  objects than `MAX_OBJECTS_PER_BYTE` per byte of it. Pickle's memo lets a 672-byte file
  build `t = (t, t)` a hundred times over: 2**100 objects by reference, which the
  unpickler itself builds at once but whose first hash (a dict key, a frozen dataclass)
  never ends. The walk counts what each value would expand to and refuses the file
  before anything is built. And the data files the metadata points DCP at must be among
  the listed files, within their sizes (`storage_problem`).

Every check returns the reason a file is refused (one line) or None; none raises.
"""

from __future__ import annotations

import os
import pickletools
import re
import stat
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from airflow_ett._untrusted import UntrustedFileError, load_json, open_regular, read_bytes

#: A marker lists a few files per rank and each rank's extra (its data cursor): a few KB
#: per rank, so this holds the largest world size events allow with room to spare.
MAX_MARKER_BYTES: Final = 64 << 20
_MARKER_DEPTH: Final = 32
#: DCP's metadata is a few hundred bytes per tensor shard: 1 GiB would be millions of
#: shards. Past this a `.metadata` is not one (and restore would hold it in memory).
MAX_METADATA_BYTES: Final = 1 << 30
#: Objects a metadata pickle may build per byte of it, counting every reference to a shared
#: object as the whole of it. Real DCP metadata builds about one per 3 bytes (0.31 for a
#: dlrm_tiny trainer checkpoint, 0.35 for the checkpoint tests' model and Adam state,
#: 2026-12-03); a memo bomb builds 2**N from six bytes per level.
MAX_OBJECTS_PER_BYTE: Final = 16
#: A marker's file name: what DCP and the trainer write (`.metadata`, `__0_0.distcp`).
_FILE_NAME: Final = re.compile(r"\.?[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}")
_CHUNK: Final = 8 << 20


def load_marker(path: Path) -> object:
    """The marker's JSON, read bounded; `UntrustedFileError` (a ValueError) otherwise."""
    return load_json(path, what="commit marker", max_bytes=MAX_MARKER_BYTES,
                     max_depth=_MARKER_DEPTH)


def listed_file_problem(directory: Path, name: object) -> str | None:
    """Why a name the marker lists cannot be one of the checkpoint's files, or None."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or name in (".", ".."):
        return f"the commit marker lists {str(name)[:80]!r}, not a file name in the directory"
    try:
        mode = os.lstat(directory / name).st_mode
    except OSError:
        return f"{name} is missing"
    if not stat.S_ISREG(mode):
        return f"{name} is not a regular file"
    return None


def crc32_of(path: Path, size: int) -> str:
    """CRC32 of the regular file at `path`, read to at most `size` + 1 bytes (a file longer
    than the marker says gives another CRC without being read to its end). Raises
    `UntrustedFileError` for anything but a regular file, OSError when it cannot be read."""
    crc, left = 0, size + 1
    with open_regular(path, what="checkpoint file") as fh:
        while left > 0 and (chunk := fh.read(min(_CHUNK, left))):
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return f"{crc:08x}"


def read_metadata_bytes(path: Path) -> bytes:
    """The `.metadata` file's bytes, bounded; `UntrustedFileError` otherwise."""
    return read_bytes(path, what="checkpoint metadata", max_bytes=MAX_METADATA_BYTES)


# -- the work a pickle can make ----------------------------------------------------------

_MARK: Final = -1
#: Opcodes that take the items above the topmost MARK and push one value built from them.
_FROM_MARK: Final = frozenset({"TUPLE", "LIST", "DICT", "FROZENSET", "INST", "OBJ"})
#: Opcodes that take the items above the MARK and add them to the value below it.
_ADD_FROM_MARK: Final = frozenset({"APPENDS", "SETITEMS", "ADDITEMS"})
_MEMO_PUT: Final = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GET: Final = frozenset({"GET", "BINGET", "LONG_BINGET"})
#: Opcodes that pop n values and push one built from them (n includes the callable).
_BUILD_N: Final = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2,
                   "NEWOBJ_EX": 3, "STACK_GLOBAL": 2}
#: Opcodes that pop n values and push nothing; or that add their top n to the value below.
_ADD_N: Final = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}
_NOTHING: Final = frozenset({"PROTO", "FRAME", "STOP", "NEXT_BUFFER", "READONLY_BUFFER"})


class _Walk:
    """The unpickler's stack and memo, each value replaced by how many objects it expands
    to (saturating at `limit`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stack: list[int] = []
        self.memo: dict[int, int] = {}

    def push(self, weight: int) -> None:
        self.stack.append(min(weight, self.limit + 1))

    def pop_mark(self) -> list[int]:
        at = len(self.stack) - 1 - self.stack[::-1].index(_MARK)
        items = self.stack[at + 1:]
        del self.stack[at:]
        return items

    def step(self, name: str, arg: object) -> None:
        if name in _MEMO_PUT or name in _MEMO_GET or name == "MEMOIZE":
            self._memo(name, arg)
        else:
            self._build(name)

    def _memo(self, name: str, arg: object) -> None:
        if name == "MEMOIZE":
            self.memo[len(self.memo)] = self.stack[-1]
            return
        if not isinstance(arg, int):  # pickletools decodes every memo index to an int
            raise ValueError(f"{name} with the memo index {arg!r}")
        if name in _MEMO_PUT:
            self.memo[arg] = self.stack[-1]
        else:
            self.push(self.memo[arg])

    def _build(self, name: str) -> None:
        st = self.stack
        if name == "MARK":
            st.append(_MARK)
        elif name in _FROM_MARK:
            self.push(1 + sum(self.pop_mark()))
        elif name in _ADD_FROM_MARK:
            added = sum(self.pop_mark())
            self.push(st.pop() + added)
        elif name in _BUILD_N:
            n = _BUILD_N[name]
            taken = st[-n:]
            del st[-n:]
            self.push(1 + sum(taken))
        elif name in _ADD_N:
            n = _ADD_N[name]
            added = sum(st[-n:])
            del st[-n:]
            self.push(st.pop() + added)
        else:
            self._plain(name)

    def _plain(self, name: str) -> None:
        if name == "POP":
            self.stack.pop()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            self.stack.append(self.stack[-1])
        elif name not in _NOTHING:  # every other opcode pushes one plain value
            self.push(1)


def pickle_work(data: bytes, *, per_byte: int = MAX_OBJECTS_PER_BYTE) -> str | None:
    """Why unpickling `data` would make too much work (or why it is no pickle), or None.

    Walks the opcodes without building anything and counts what every value expands to,
    a shared (memoized) value counting whole each time it is referenced: what hashing,
    comparing or walking the result would cost. Over `per_byte` objects per byte (plus
    a floor for tiny files) the pickle is refused."""
    limit = per_byte * len(data) + 10_000
    walk = _Walk(limit)
    try:
        for op, arg, _ in pickletools.genops(data):
            walk.step(op.name, arg)
            if walk.stack and walk.stack[-1] > limit:
                return (f"the pickle builds more than {limit:,} objects from its "
                        f"{len(data):,} bytes (shared nested values)")
    except (ValueError, KeyError, IndexError) as exc:  # truncated, unknown opcode, bad memo
        return f"not a readable pickle ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def storage_problem(storage_data: Mapping[object, object], sizes: Mapping[str, int]
                    ) -> str | None:
    """Why the data locations DCP's metadata gives are not within the marker's files
    (`sizes`: each listed file's size): each must be a listed file, its bytes within the
    size the marker states (a location naming `/dev/zero`, another directory or a huge
    range would otherwise be opened and read)."""
    for index, info in storage_data.items():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(name, str) or name not in sizes:
            return f"the metadata points {index} at {str(name)[:80]!r}, not a listed file"
        size = sizes[name]
        if not (isinstance(offset, int) and isinstance(length, int)
                and offset >= 0 and length >= 0 and offset + length <= size):
            return (f"the metadata reads {name} at {offset!r} for {length!r} bytes, beyond "
                    f"its {size!r} bytes")
    return None


__all__ = ["MAX_MARKER_BYTES", "MAX_METADATA_BYTES", "UntrustedFileError", "crc32_of",
           "listed_file_problem", "load_marker", "pickle_work", "read_metadata_bytes",
           "storage_problem"]
