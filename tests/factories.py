"""What many tests build events from, in one place: a time inside the event format's
bounds (`TS_MIN`..`TS_MAX`, docs/events.md), and a minimal valid event of every type as
the JSON object a producer would send."""

from __future__ import annotations

from typing import Any

T0 = 1_795_856_000.0  # 2026-11-28T06:13:20Z: event times must be real Unix seconds

MINIMAL: dict[str, dict[str, Any]] = {
    "job_submitted": {"tenant": "t", "model": "m", "dag_id": "d", "run_id": "r"},
    "attempt_started": {"attempt": "1", "host": "h"},
    "attempt_ended": {"attempt": "1", "status": "failed", "cause": "infra",
                      "detected_ts": T0, "message": "boom"},
    "phase_started": {"attempt": "1", "phase": "compile", "span": "s"},
    "progress": {"attempt": "1", "start_ts": T0 - 1, "step_start": 0, "step_end": 1,
                 "cursor_start": 0, "cursor_end": 1},
    "checkpoint_saved": {"attempt": "1", "start_ts": T0 - 1, "step": 1, "cursor": 1,
                         "blocking_s": 1.0, "total_s": 2.0},
    "job_ended": {"status": "success"},
    "task_state": {"dag_id": "d", "task_id": "train", "state": "running", "message": "m"},
    "model_published": {"uri": "s3://m"},
}
"""Every field of each type beyond id, job and ts, set to a valid value."""


def event_dict(etype: str, **changes: Any) -> dict[str, Any]:
    """A valid `etype` event as a JSON object, with `changes` on top (a value of `...`
    leaves that field out)."""
    obj = {"type": etype, "id": "e1", "job": "j", "ts": T0, **MINIMAL[etype], **changes}
    return {k: v for k, v in obj.items() if v is not ...}
