"""Reading back: run listings with filters, a job's events, a job's row."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from airflow_ett.ett.events import Event, Progress, event_from_dict
from airflow_ett.store import EttStore
from tests.store.ett_store_helpers import job_events

DAY = 86_400.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _fill(store: EttStore) -> None:
    store.insert_events(job_events("a", t0=T0, tenant="ads", model="m1", dag_id="d1"))
    store.insert_events(job_events("b", t0=T0 + DAY, tenant="ads", model="m2", dag_id="d2"))
    store.insert_events(job_events("c", t0=T0 + 2 * DAY, tenant="feed", model="m1",
                                   dag_id="d1", ended=False))
    store.insert_events(job_events("d", t0=T0 + 3 * DAY, tenant="feed", model="m2",
                                   dag_id="d2"))
    # A job whose submission has not arrived yet: no submitted time to filter on.
    store.insert_events([Progress(id="e/p", job="e", ts=T0, attempt="a", start_ts=T0 - 1,
                                  step_start=0, step_end=1, cursor_start=0, cursor_end=1)])


def _jobs(rows: list) -> list[str]:  # type: ignore[type-arg]
    return [row.job for row in rows]


def test_list_runs_newest_first_with_unsubmitted_last(store: EttStore) -> None:
    _fill(store)
    assert _jobs(store.list_runs()) == ["d", "c", "b", "a", "e"]
    assert _jobs(store.list_runs(limit=2)) == ["d", "c"]
    assert len(store.list_runs(limit=None)) == 5


def test_list_runs_filters(store: EttStore) -> None:
    _fill(store)
    assert _jobs(store.list_runs(since=T0 + DAY)) == ["d", "c", "b"]
    assert _jobs(store.list_runs(until=T0 + DAY)) == ["a"]
    assert _jobs(store.list_runs(since=T0 + DAY, until=T0 + 3 * DAY)) == ["c", "b"]
    assert _jobs(store.list_runs(tenant="ads")) == ["b", "a"]
    assert _jobs(store.list_runs(model="m1")) == ["c", "a"]
    assert _jobs(store.list_runs(dag_id="d2", tenant="feed")) == ["d"]
    assert store.list_runs(tenant="nobody") == []


def test_list_runs_takes_datetimes(store: EttStore) -> None:
    _fill(store)
    since = datetime(2026, 1, 2, tzinfo=UTC)
    assert _jobs(store.list_runs(since=since, until=datetime(2026, 1, 3))) == ["b"]


def test_list_runs_reports_status(store: EttStore) -> None:
    _fill(store)
    status = {row.job: (row.status, row.ended_ts is None) for row in store.list_runs()}
    assert status["c"] == ("running", True)
    assert status["a"] == ("success", False)


def test_job_events_round_trip(store: EttStore) -> None:
    original = job_events("j1", t0=T0, steps=8)
    shuffled = original[::2] + original[1::2]
    store.insert_events(shuffled[:5])
    store.insert_events(shuffled[5:])
    stored = store.job_events("j1")
    assert [e.ts for e in stored] == sorted(e.ts for e in original)

    def order(e: Event) -> tuple[float, str]:
        return e.ts, e.id

    assert sorted(stored, key=order) == sorted(original, key=order)
    assert [type(e) for e in sorted(stored, key=order)] == [
        type(e) for e in sorted(original, key=order)]
    assert store.job_events("unknown") == []


def test_job_events_keep_iso_times_and_extra_fields(store: EttStore) -> None:
    event = event_from_dict({"type": "job_submitted", "id": "s", "job": "iso",
                             "ts": "2026-01-01T00:00:00.125+00:00", "tenant": "t",
                             "producer_field": "ignored", "attrs": {"k": [1, 2.5, None]}})
    store.insert_events([event])
    (back,) = store.job_events("iso")
    assert back == event and back.ts == T0 + 0.125
    assert msgspec.to_builtins(back) == msgspec.to_builtins(event)


def test_equal_times_come_back_in_ingest_order(store: EttStore) -> None:
    events: list[Event] = [
        Progress(id=f"z{i}", job="t", ts=T0 + 100.0, attempt="a", start_ts=T0 + 99.0, step_start=i,
                 step_end=i + 1, cursor_start=i, cursor_end=i + 1)
        for i in range(3)
    ]
    for event in events:
        store.insert_events([event])
    assert [e.id for e in store.job_events("t")] == ["z0", "z1", "z2"]


def test_get_job_unknown_is_none(store: EttStore) -> None:
    assert store.get_job("nope") is None
