"""Idempotent ingest and the job rows derived from it."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import msgspec
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.events import Event, JobEnded, JobSubmitted, Progress
from airflow_ett.store import EttStore, JobRow
from airflow_ett.store.schema import events as events_table
from tests.factories import T0 as T
from tests.store.ett_store_helpers import job_events


def test_same_events_twice_count_once(store: EttStore) -> None:
    evs = job_events("j1")
    assert store.insert_events(evs) == len(evs)
    assert store.insert_events(evs) == 0
    assert store.insert_events(reversed(evs)) == 0
    assert store.count_events() == len(evs)
    job = store.get_job("j1")
    assert job is not None and job.version == len(evs)


def test_duplicates_inside_one_batch_count_once(store: EttStore) -> None:
    evs = job_events("j1")
    assert store.insert_events(evs + evs[:3] + evs) == len(evs)
    assert store.count_events("j1") == len(evs)
    assert store.insert_events([]) == 0


def test_overlapping_batches_count_only_the_new_ones(store: EttStore) -> None:
    evs = job_events("j1")
    assert store.insert_events(evs[:4]) == 4
    assert store.insert_events(evs[2:7]) == 3
    job = store.get_job("j1")
    assert job is not None and job.version == 7
    assert store.insert_events(evs) == len(evs) - 7


def test_first_stored_version_of_an_id_wins(store: EttStore) -> None:
    first = JobSubmitted(id="same", job="j1", ts=T + 10.0, tenant="a")
    second = JobSubmitted(id="same", job="j1", ts=T + 5.0, tenant="b")
    assert store.insert_events([first, second]) == 1
    assert store.insert_events([second]) == 0
    assert store.job_events("j1") == [first]


def test_job_row_follows_submission_and_end(store: EttStore) -> None:
    evs = job_events("j1", t0=T + 1000.0, tenant="ads", model="m1", dag_id="d1")
    *body, attempt_end, end = evs
    store.insert_events(body)
    running = store.get_job("j1")
    assert running == JobRow(
        job="j1", tenant="ads", model="m1", dag_id="d1", run_id="run-j1",
        submitted_ts=T + 1000.0, ended_ts=None, status="running",
        last_event_ts=max(e.ts for e in body), version=len(body),
    )
    store.insert_events([attempt_end, end])
    done = store.get_job("j1")
    assert done is not None
    assert (done.ended_ts, done.status, done.version) == (end.ts, "success", len(evs))
    assert done.last_event_ts == end.ts
    assert done.submitted_ts == T + 1000.0 and done.tenant == "ads"


def test_job_row_exists_before_its_submission_arrives(store: EttStore) -> None:
    progress = Progress(id="p", job="j1", ts=T + 20.0, attempt="a", start_ts=T + 19.0,
                        step_start=0, step_end=1, cursor_start=0, cursor_end=1)
    store.insert_events([progress])
    early = store.get_job("j1")
    assert early is not None
    assert (early.tenant, early.submitted_ts, early.status, early.version) == (
        None, None, "running", 1)
    store.insert_events([JobSubmitted(id="s", job="j1", ts=T + 10.0, tenant="t", model="m")])
    late = store.get_job("j1")
    assert late is not None
    assert (late.tenant, late.model, late.submitted_ts, late.last_event_ts, late.version) == (
        "t", "m", T + 10.0, T + 20.0, 2)


def test_earliest_submission_and_latest_end_win_in_any_order(store: EttStore) -> None:
    def lifecycle(job: str) -> list[Event]:
        return [JobSubmitted(id=f"{job}/s1", job=job, ts=T + 10.0, tenant="first"),
                JobSubmitted(id=f"{job}/s2", job=job, ts=T + 20.0, tenant="second"),
                JobEnded(id=f"{job}/e1", job=job, ts=T + 30.0, status="failed"),
                JobEnded(id=f"{job}/e2", job=job, ts=T + 40.0, status="success")]

    early_sub, late_sub, early_end, late_end = lifecycle("x")
    store.insert_events([late_sub, late_end])
    store.insert_events([early_sub, early_end])
    early_sub, late_sub, early_end, late_end = lifecycle("y")
    store.insert_events([early_sub, early_end])
    store.insert_events([late_sub, late_end])
    for job in ("x", "y"):
        row = store.get_job(job)
        assert row is not None
        assert (row.tenant, row.submitted_ts, row.status, row.ended_ts, row.version) == (
            "first", T + 10.0, "success", T + 40.0, 4)


def test_seq_records_ingest_order(store: EttStore) -> None:
    store.insert_events(job_events("late", t0=T + 5000.0))
    store.insert_events(job_events("early", t0=T + 1000.0))
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(events_table.c.job, events_table.c.seq)
                            .order_by(events_table.c.seq)).all()
    seqs = [seq for _, seq in rows]
    assert len(set(seqs)) == len(seqs)
    assert [job for job, _ in rows] == ["late"] * (len(rows) // 2) + ["early"] * (len(rows) // 2)


_EVENTS = job_events("base", steps=6)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(_EVENTS) - 1), min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=5),
)
def test_any_order_and_duplication_stores_the_same_set(
    store: EttStore, unique_job: Callable[[str], str], picks: list[int], cuts: list[int]
) -> None:
    """Whatever permutation, repetition and batching the events arrive in, the store ends
    with each distinct event once, the job's version equal to their number, and the job
    row the same as for one clean, ordered insert."""
    job, reference = unique_job("h"), unique_job("ref")
    sent = [_rename(_EVENTS[i], job) for i in picks]
    distinct = {e.id: e for e in sent}
    bounds = sorted({0, len(sent), *(c for c in cuts if c < len(sent))})
    new = sum(store.insert_events(sent[lo:hi]) for lo, hi in pairwise(bounds))
    assert new == len(distinct) == store.count_events(job)
    stored = store.job_events(job)
    assert sorted(stored, key=lambda e: e.id) == sorted(distinct.values(), key=lambda e: e.id)
    assert [e.ts for e in stored] == sorted(e.ts for e in stored)

    store.insert_events(sorted((_rename(e, reference) for e in distinct.values()),
                               key=lambda e: e.ts))
    row, ref_row = store.get_job(job), store.get_job(reference)
    assert row is not None and ref_row is not None
    assert row.version == len(distinct)
    assert _without_job(row) == _without_job(ref_row)


def _rename(event: Event, job: str) -> Event:
    renamed: Event = msgspec.structs.replace(event, job=job, id=f"{job}/{event.id}")
    if isinstance(renamed, JobSubmitted):
        renamed = msgspec.structs.replace(renamed, run_id="run")
    return renamed


def _without_job(row: JobRow) -> tuple[object, ...]:
    return (row.tenant, row.model, row.dag_id, row.run_id, row.submitted_ts, row.ended_ts,
            row.status, row.last_event_ts, row.version)
