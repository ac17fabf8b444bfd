"""Progress read from a command's log lines: Level 1 for a trainer that reports nothing.

A command that knows nothing of ETT still prints its steps (`step 120 loss 0.31`). With
`progress_pattern` (a regular expression with a named group `step`, and optionally
`cursor` and `loss`), the train task reads each line the command prints, and a line that
matches is that step's end, reported through `emit.progress.ProgressSpans` for the
attempt that printed it. Without a `cursor` group the cursor is the step (one unit of
data per step: a trainer that resumes from its checkpoint prints steps that go on from
there; one that starts over prints steps below the job's high-water mark: replay).
"""

from __future__ import annotations

import math
import re
from typing import Final

from airflow_ett.emit import Emitter
from airflow_ett.emit.progress import ProgressSpans
from airflow_ett.operators.job import JobConfigError

#: A step number or cursor past this is not one (the events' 64-bit integers).
_MAX_INT: Final = (1 << 62)
#: A log line is read this far at most (a megabyte-long line is not a step line).
_MAX_LINE: Final = 4096


def compile_pattern(where: str, pattern: object) -> re.Pattern[str] | None:
    """`progress_pattern` checked: None, or a regex with a named group `step` (and only
    `step`, `cursor`, `loss` as named groups); one line naming the problem otherwise."""
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern or len(pattern) > 1000:
        raise JobConfigError(f"{where}: progress_pattern = {pattern!r}: must be a regular "
                             "expression of at most 1000 characters")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise JobConfigError(f"{where}: progress_pattern = {pattern!r}: not a regular "
                             f"expression: {exc}") from None
    groups = set(compiled.groupindex)
    if "step" not in groups or groups - {"step", "cursor", "loss"}:
        raise JobConfigError(f"{where}: progress_pattern = {pattern!r}: must have a named "
                             "group 'step' (?P<step>...) and may have 'cursor' and 'loss', "
                             f"no others (it has {sorted(groups)})")
    return compiled


class LogProgress:
    """Reads one attempt's output lines; reports the steps they show."""

    def __init__(self, pattern: re.Pattern[str], emitter: Emitter) -> None:
        self._pattern = pattern
        self._spans = ProgressSpans(emitter)

    def line(self, text: str, ts: float | None = None) -> None:
        found = self._pattern.search(text[:_MAX_LINE])
        if found is None:
            return
        step = _whole(found.group("step"))
        if step is None:
            return
        groups = found.groupdict()
        cursor = _whole(groups.get("cursor")) if groups.get("cursor") is not None else step
        if cursor is None:
            return
        self._spans.step(step, cursor, ts=ts, loss=_number(groups.get("loss")))

    def close(self) -> None:
        self._spans.flush()


def _whole(text: str | None) -> int | None:
    if text is None or not text.isdigit() or len(text) > 19:
        return None
    value = int(text)
    return value if value < _MAX_INT else None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
