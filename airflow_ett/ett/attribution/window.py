"""Stage 2, job window: when the job's wall time starts and ends, and in what order its
attempts ran.

Guarantees: `submit <= end`; the window starts at the earliest `job_submitted` (ties by
id), else at the earliest event; it ends at the latest `job_ended` (ties by id), else at
the end of a last attempt that succeeded, else at `now`, and the job is then provisional
(still running). Attempts are ordered by (start, id). Every guess made here is a warning.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from airflow_ett.ett.attribution.collect import AttemptReport, Collected
from airflow_ett.ett.events import JobSubmitted
from airflow_ett.ett.timeline import to_us


@dataclass(frozen=True, slots=True)
class JobWindow:
    meta: JobSubmitted | None  # the submission that opens the window, if any came
    submit: int
    end: int
    provisional: bool  # no end reported: the job runs until `now`
    status: str | None  # "success" | "failed" | "cancelled"; None while running
    attempts: tuple[AttemptReport, ...]  # ordered by (start, id); starts not yet clipped
    warnings: tuple[str, ...]


def job_window(collected: Collected, now: float | None) -> JobWindow:
    warnings: list[str] = []
    meta = min(collected.submitted, key=lambda s: (s.ts, s.id)) if collected.submitted else None
    if meta is not None:
        submit = to_us(meta.ts)
    else:
        submit = collected.earliest
        warnings.append("no job_submitted event: E2E starts at the earliest event")
    warnings += [f"attempt {a.id!r} has no attempt_started: starts at its first event"
                 for a in collected.attempts if not a.start_reported]
    ordered = tuple(sorted(collected.attempts, key=lambda a: (a.start, a.id)))
    end, status = _end(collected, ordered)
    provisional = end is None
    if end is None:
        end = to_us(time.time() if now is None else now)
    if end < submit:
        warnings.append("the job ends before it was submitted: E2E is 0")
        end = submit
    return JobWindow(meta, submit, end, provisional, status, ordered, tuple(warnings))


def _end(collected: Collected, ordered: tuple[AttemptReport, ...]) -> tuple[int | None, str | None]:
    """The job's reported end and status; (None, None) while it runs."""
    if collected.ended:
        last = max(collected.ended, key=lambda x: (x.ts, x.id))
        return to_us(last.ts), last.status
    if ordered and ordered[-1].status == "success" and ordered[-1].end is not None:
        return ordered[-1].end, "success"
    return None, None
