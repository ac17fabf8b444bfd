"""`EttStore.follow` (store/follow.py, decision 0034): a job's attribution, read on from
where the last read stopped, is `attribute_job(store.job_events(job), now)` whatever came
since: events in time order, late ones within the margin (read on) or older (the job is
read again whole), rows that no longer decode; jobs read least recently are dropped past
the memory bound. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import Event, ModelPublished, Progress
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.store import EttStore
from airflow_ett.store.follow import Followed, JobFollowers
from airflow_ett.store.schema import events as events_table
from tests.ett.strategies import soups
from tests.ett.test_incremental import arrivals, jobs


def renamed(events: list[Event], job: str, shift_s: float = 0.0) -> list[Event]:
    """The events as another job's (ids too: one store holds many examples), their times
    `shift_s` later."""
    return [msgspec.structs.replace(e, job=job, id=f"{job}/{e.id}", **{
        name: getattr(e, name) + shift_s for name in e.TIME_FIELDS
        if getattr(e, name) is not None}) for e in events]


def one_pass(store: EttStore, job: str, now: float) -> tuple[object, list[ModelPublished],
                                                              float]:
    events = store.job_events(job)
    return (attribute_job(events, now=now), [e for e in events if isinstance(e, ModelPublished)],
            max(e.ts for e in events))


def check(found: Followed | None, store: EttStore, job: str, now: float) -> None:
    assert found is not None
    attribution, published, last_ts = one_pass(store, job, now)
    assert found.attribution == attribution
    assert list(found.published) == published
    assert found.last_ts == last_ts
    assert found.events == len(store.job_events(job))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_job_read_on_is_attributed_as_all_its_events_are(
        store: EttStore, unique_job: Callable[[str], str], data: st.DataObject) -> None:
    job = unique_job("follow")
    kind = data.draw(st.sampled_from(["job", "soup"]), label="kind")
    events = renamed(data.draw(jobs() if kind == "job" else soups(), label="events"), job,
                     0.0 if kind == "job" else 1.8e9)  # a soup's times start at 0
    events = data.draw(arrivals(events), label="arrival")
    followers = JobFollowers(store, margin_s=data.draw(st.sampled_from([0.0, 2.0, 300.0]),
                                                       label="margin"))
    at = 0
    while at < len(events):
        n = data.draw(st.integers(1, 15), label="batch")
        store.insert_events(events[at:at + n])
        at += n
        now = max(e.ts for e in events[:at]) + data.draw(
            st.sampled_from([-2.0, 0.0, 1.0, 600.0]), label="now")
        check(followers.attribution(job, now), store, job, now)


def running_job(job: str, *, steps: int = 600) -> list[Event]:
    spec = JobSpec(job=job, steps=10 * steps, step_s=1.0, progress_every=1,
                   checkpoint_every=120, running_until_step=steps,
                   failures=(InjectedFailure(at_step=steps // 2, cause="infra"),))
    return sorted(simulate(spec), key=lambda e: e.ts)


def test_a_running_job_is_read_whole_once_then_read_on(
        store: EttStore, unique_job: Callable[[str], str]) -> None:
    job = unique_job("run")
    events = running_job(job)
    followers = JobFollowers(store)
    reads = []
    for end in range(200, len(events) + 1, 50):
        store.insert_events(events[end - 50 if end > 200 else 0:end])
        now = events[end - 1].ts + 0.5
        found = followers.attribution(job, now)
        check(found, store, job, now)
        assert found is not None
        reads.append(found.read_whole)
    assert reads[0] and not any(reads[1:])
    assert followers.kept_events == len(store.job_events(job))


def test_a_late_event_is_read_on_within_the_margin_and_reads_the_job_whole_past_it(
        store: EttStore, unique_job: Callable[[str], str]) -> None:
    job = unique_job("late")
    events = running_job(job)
    spans = [e for e in events if isinstance(e, Progress)]
    recent, old = spans[-3], spans[10]
    store.insert_events([e for e in events if e not in (recent, old)])
    followers = JobFollowers(store, margin_s=60.0)
    now = events[-1].ts + 1
    assert followers.attribution(job, now) is not None
    store.insert_events([recent])  # 3 s late: inside the margin
    found = followers.attribution(job, now)
    check(found, store, job, now)
    assert found is not None and not found.read_whole
    store.insert_events([old])  # minutes late: older than the margin
    found = followers.attribution(job, now + 1)
    check(found, store, job, now + 1)
    assert found is not None and found.read_whole


def test_a_row_that_no_longer_decodes_is_left_out_as_job_events_leaves_it(
        store: EttStore, unique_job: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    job = unique_job("odd")
    events = running_job(job, steps=100)
    store.insert_events(events[:-20])
    odd = {"type": "job_ended", "v": 1, "id": f"{job}/odd", "job": job, "ts": 1e300,
           "status": "success"}
    with store.engine.begin() as conn:  # as an earlier version let it in (no version bump)
        row = {"id": f"{job}/odd", "job": job, "type": "job_ended", "ts": events[-21].ts,
               "attempt": None, "payload": json.dumps(odd), "ingested_at": 0.0}
        if conn.dialect.name == "sqlite":  # PostgreSQL numbers it itself
            row["seq"] = (conn.scalar(sa.select(sa.func.max(events_table.c.seq))) or 0) + 1
        conn.execute(events_table.insert().values(**row))
    followers = JobFollowers(store)
    now = events[-1].ts + 1
    check(followers.attribution(job, now), store, job, now)
    assert "left out" in caplog.text
    store.insert_events(events[-20:])
    found = followers.attribution(job, now)
    check(found, store, job, now)
    assert found is not None and not found.read_whole  # the count still balances


def test_jobs_read_least_recently_go_first_past_the_bound(
        store: EttStore, unique_job: Callable[[str], str]) -> None:
    a, b = unique_job("a"), unique_job("b")
    for job in (a, b):
        store.insert_events(running_job(job, steps=100))
    followers = JobFollowers(store, max_events=150)
    now = 2e9
    assert followers.attribution(a, now) is not None
    found = followers.attribution(b, now)
    assert found is not None and found.read_whole
    assert followers.kept_events == found.events  # a went
    found = followers.attribution(a, now)
    assert found is not None and found.read_whole
    check(found, store, a, now)


def test_a_job_without_events_is_none_and_not_kept(store: EttStore) -> None:
    assert store.follow.attribution("no-such-job", 1.0) is None
    assert store.follow.kept_events == 0


def test_asks_from_many_threads_while_events_arrive_agree_with_one_pass(
        store: EttStore, unique_job: Callable[[str], str]) -> None:
    job = unique_job("threads")
    events = running_job(job)
    store.insert_events(events[:100])
    errors: list[BaseException] = []
    done = threading.Event()

    def ask() -> None:
        try:
            while not done.is_set():
                found = store.follow.attribution(job, events[-1].ts)
                assert found is not None and found.events >= 100
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for at in range(100, len(events), 37):
        store.insert_events(events[at:at + 37])
    done.set()
    for t in threads:
        t.join(30)
    assert not errors
    check(store.follow.attribution(job, events[-1].ts + 1), store, job, events[-1].ts + 1)
