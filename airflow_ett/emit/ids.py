"""Event and span ids: unique without coordination, and cheap on the caller's thread.

A uuid4 per event costs more than the rest of an emit together; a random per-process
prefix (64 bits, so collisions across all emitters ever are negligible) and a counter
cost a string format. `itertools.count` is atomic under the GIL, so threads share one.
"""

from __future__ import annotations

import itertools
import secrets


class IdSource:
    __slots__ = ("_counter", "prefix")

    def __init__(self) -> None:
        self.prefix = ""
        self._counter = itertools.count(1)
        self.after_fork()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self._counter):x}"

    def after_fork(self) -> None:
        """A forked child has the parent's prefix and counter: both would repeat ids."""
        self.prefix = secrets.token_hex(8) + "-"
        self._counter = itertools.count(1)
