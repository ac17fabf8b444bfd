"""`EttStore.job_summary`: the typed summary, cached as `summary` is, and a cached row an
older version left that today's contract does not fit computed again from the events."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.summary import SummaryError
from airflow_ett.store import EttStore
from airflow_ett.store.schema import jobs, summaries
from tests.store.ett_store_helpers import job_events


def _cache(store: EttStore, job: str, payload: dict[str, Any]) -> None:
    """A cached row for the job's current version, as an older version could have left."""
    with store.engine.connect() as conn:
        version = conn.scalar(sa.select(jobs.c.version).where(jobs.c.job == job))
    row = {"job": job, "version": version, "computed_at": 0.0, "provisional": False,
           "payload": json.dumps(payload)}
    store._write(lambda conn: conn.execute(store._upsert_summary, row))


def _payload(store: EttStore, job: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        text = conn.scalar(sa.select(summaries.c.payload).where(summaries.c.job == job))
    assert isinstance(text, str)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def test_job_summary_is_the_typed_form_of_summary(store: EttStore) -> None:
    evs = job_events("j1")
    store.insert_events(evs)
    typed = store.job_summary("j1")
    assert typed == attribute_job(evs).summary()
    assert typed.to_dict() == store.summary("j1") == _payload(store, "j1")
    assert store.job_summary("j1") == typed  # from the cache now


@pytest.mark.parametrize("older", [
    {"job": "j1", "ett_pct": None, "e2e_s": float("inf")},  # odd values, keys missing
    {"version": 99},  # a newer version's row
])
def test_a_cached_row_that_does_not_fit_is_computed_again(
        store: EttStore, older: dict[str, Any]) -> None:
    evs = job_events("j1")
    store.insert_events(evs)
    real = attribute_job(evs).summary()
    row = {**real.to_dict(), **older} if "version" in older else older
    _cache(store, "j1", row)
    assert store.summary("j1") == json.loads(json.dumps(row))  # handed on as stored
    assert store.job_summary("j1") == real
    assert _payload(store, "j1") == real.to_dict()  # and the cache rewritten


def test_an_unreadable_row_with_no_events_to_replace_it(store: EttStore) -> None:
    with store.engine.begin() as conn:  # a job row with no events, as in tests/cli
        conn.execute(jobs.insert().values(job="gone", submitted_ts=1.7e9, status="success",
                                          last_event_ts=1.7e9, version=1))
    _cache(store, "gone", {"job": "gone", "ett_pct": None})
    with pytest.raises(SummaryError, match="job 'gone': the cached summary cannot be read"):
        store.job_summary("gone")
