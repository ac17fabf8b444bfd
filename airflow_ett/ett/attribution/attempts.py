"""Stage 3, close attempts: give every attempt an end and a status, inside the window.

Guarantees, for the attempts in order: `submit <= start <= end <= window end`, and an
attempt ends no later than the next one starts (attempts never overlap). An attempt that
never reported its end failed (cause `unknown`) when the next one started; the last one
ends with the job, with the job's status, or is still running (status None) while the
job runs. Every such inference is flagged (`inferred`), and overlaps are warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.collect import AttemptReport, Span
from airflow_ett.ett.attribution.window import JobWindow


@dataclass(frozen=True, slots=True)
class ClosedAttempt:
    id: str
    start: int
    end: int
    status: str | None  # "success" | "failed"; None while running
    cause: str | None  # set exactly when failed
    detected: int | None  # when its failure was noticed, as reported (not clipped)
    exit_code: int | None
    inferred: bool  # its end or status was inferred, not reported
    spans: Sequence[Span]
    message: str | None = None  # its reported end's message (a failure's reason)


@dataclass(frozen=True, slots=True)
class ClosedAttempts:
    attempts: tuple[ClosedAttempt, ...]  # in the window's order
    warnings: tuple[str, ...]


def close_attempts(window: JobWindow) -> ClosedAttempts:
    warnings: list[str] = []
    closed = []
    ordered = window.attempts
    for i, a in enumerate(ordered):
        nxt = ordered[i + 1].start if i + 1 < len(ordered) else None
        closed.append(_close(a, nxt, window, warnings))
    return ClosedAttempts(tuple(closed), tuple(warnings))


def _close(a: AttemptReport, nxt: int | None, window: JobWindow,
           warnings: list[str]) -> ClosedAttempt:
    """One attempt, given the (unclipped) start of the next one."""
    end, status, cause, inferred = a.end, a.status, a.cause, False
    if end is None:
        inferred = nxt is not None or window.status is not None
        if nxt is not None:
            end, status, cause = nxt, "failed", "unknown"
            warnings.append(f"attempt {a.id!r} never reported its end: failed (unknown) "
                            "when the next attempt started")
        else:
            end = window.end  # with the job, or still running
            if window.status is not None:
                succeeded = window.status == "success"
                status = "success" if succeeded else "failed"
                cause = None if succeeded else "unknown"
    start = min(max(a.start, window.submit), window.end)
    limit = window.end if nxt is None else min(max(nxt, window.submit), window.end)
    if nxt is not None and end > nxt:  # an overlap, whether or not clipping hides it
        warnings.append(f"attempt {a.id!r} overlaps the next one: cut at its start")
    end = min(end, limit)
    return ClosedAttempt(a.id, start, max(end, start), status, cause, a.detected, a.exit_code,
                         inferred, a.spans, a.message)
