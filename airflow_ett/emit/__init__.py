"""Recording ETT events from trainers, operators and listeners, safely.

`get_emitter()` (or an `Emitter`) records; a background writer batches events into the
ETT store, spools them to local files when the store cannot take them, and replays those
later (`replay_spool`, also run automatically when an emitter starts). Module map:
`emitter` (the API callers use), `worker` (queue and background threads), `spool`
(spool files, replay, and their safety scheme), `sinks` (where batches go), `ids`.
"""

from airflow_ett.emit.emitter import (
    ATTEMPT_ENV,
    JOB_ENV,
    Emitter,
    get_emitter,
    reset_default_emitter,
)
from airflow_ett.emit.sinks import EventSink, JsonlSink, StoreSink
from airflow_ett.emit.spool import ReplayResult, replay_spool
from airflow_ett.emit.worker import EmitterStats, close_all

__all__ = [
    "ATTEMPT_ENV",
    "JOB_ENV",
    "Emitter",
    "EmitterStats",
    "EventSink",
    "JsonlSink",
    "ReplayResult",
    "StoreSink",
    "close_all",
    "get_emitter",
    "replay_spool",
    "reset_default_emitter",
]
