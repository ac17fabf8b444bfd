"""Files another process or person could leave where a reader looks (issue 22, class 3).

Each maker puts one hostile kind of file at `path` and says what the reader must answer:
a FIFO with no writer (a plain `open` blocks forever), a symlink to `/dev/zero` (a plain
`read` never ends), a sparse file far larger than any real one (costs no disk), bytes
that are not UTF-8, and JSON/TOML nested thousands of levels deep (the parsers' own
recursion fails). Tests of every reader take them all through `HOSTILE`, so a reader
added later is tested against the whole class, not one member.

`in_thread` runs a read in a daemon thread and fails the test when it does not return:
a reader that blocks makes the test fail, never hang.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Deep enough that Python's and msgspec's recursive parsers give up (3.11: ~1000 frames).
DEEP: int = 5000


def fifo(path: Path) -> str:
    os.mkfifo(path)
    return "not a regular file (a FIFO)"


def dev_zero(path: Path) -> str:
    path.symlink_to("/dev/zero")
    return "not a regular file (a character device)"


def huge(path: Path, size: int = 200 << 20) -> str:
    """A sparse file of `size` bytes (200 MB by default): no disk used, all of it zeros."""
    with open(path, "wb") as fh:
        fh.truncate(size)
    return "larger than its limit of"


def not_utf8(path: Path) -> str:
    path.write_bytes(b'{"x": "r\xe9gie"}\n')
    return "not UTF-8 text"


def deep_json(path: Path) -> str:
    path.write_text("[" * DEEP + "]" * DEEP)
    return "nested deeper than"


def deep_toml(path: Path) -> str:
    path.write_text("x = " + "[" * DEEP + "]" * DEEP + "\n")
    return "nested deeper than"


def directory(path: Path) -> str:
    path.mkdir()
    return "not a regular file (a directory)"


#: Every kind, by name, for `pytest.mark.parametrize`: (name, maker) pairs. A JSON reader
#: takes `HOSTILE_JSON`, a TOML reader `HOSTILE_TOML`.
_COMMON = [("fifo", fifo), ("dev_zero", dev_zero), ("huge", huge), ("not_utf8", not_utf8),
           ("directory", directory)]
HOSTILE_JSON = [*_COMMON, ("deep", deep_json)]
HOSTILE_TOML = [*_COMMON, ("deep", deep_toml)]


def in_thread(call: Callable[[], T], *, timeout: float = 60.0) -> T:
    """`call()`'s result (or its exception, raised again); a failed test when it has not
    returned after `timeout` seconds (the thread is left behind as a daemon)."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            error.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise AssertionError(f"the read did not return in {timeout} s (it blocks)")
    if error:
        raise error[0]
    return result[0]
