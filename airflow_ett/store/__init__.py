"""The ETT store: where events land and attribution is read back.

Its own database engine (SQLite by default, PostgreSQL in production), never Airflow's
session; versioned migrations; idempotent writes keyed on event ids. Use::

    from airflow_ett.store import EttStore, upgrade

    upgrade(url)                   # once per deployment, or `airflow-ett db upgrade`
    store = EttStore(url)          # one per process
    store.insert_events(events)    # -> how many were new
    store.job_summary(job_id)      # -> JobSummary, cached per job version
    store.summary(job_id)          # -> its JSON form, as cached
"""

from __future__ import annotations

from airflow_ett.store.errors import JobNotFound, StoreError, StoreUnavailable, mask_url
from airflow_ett.store.migrate import current, head, upgrade
from airflow_ett.store.store import EttStore, JobRow

__all__ = [
    "EttStore",
    "JobNotFound",
    "JobRow",
    "StoreError",
    "StoreUnavailable",
    "current",
    "head",
    "mask_url",
    "upgrade",
]
