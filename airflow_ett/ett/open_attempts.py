"""Which of a job's trainer attempts are still open: started, never reported ended.

An attempt reports its own end (the trainer, or the train task for a trainer it saw
killed). When the whole worker is lost (host down, its process tree SIGKILLed), neither
is left to say so; Airflow's scheduler notices the task's missing heartbeats and fails
the try from outside. That moment is when the failure was detected, and the attempts
still open then died with the worker: `airflow_ett.plugin.listeners` closes them there,
with cause `infra`, so the attribution sees a detected infrastructure failure instead of
an attempt that ended, cause unknown, whenever the next one happened to start.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_ett.ett.events import AttemptEnded, AttemptStarted, Event


def open_attempts(events: Iterable[Event]) -> list[str]:
    """Attempt ids with an `attempt_started` and no `attempt_ended`, in order of start."""
    started: dict[str, float] = {}
    ended: set[str] = set()
    for event in events:
        if isinstance(event, AttemptStarted):
            started[event.attempt] = min(event.ts, started.get(event.attempt, event.ts))
        elif isinstance(event, AttemptEnded):
            ended.add(event.attempt)
    return sorted((a for a in started if a not in ended), key=lambda a: (started[a], a))
