"""Several writer processes on one store: nothing lost, nothing doubled, no lost bump."""

from __future__ import annotations

import multiprocessing
import random

import pytest
import sqlalchemy as sa

from airflow_ett.ett.events import event_to_dict
from airflow_ett.store import EttStore
from airflow_ett.store.schema import events as events_table
from tests.store.ett_store_helpers import insert_worker, job_events

WRITERS = 4
JOBS = 6
STEPS = 60


@pytest.mark.integration
def test_concurrent_writers_overlapping_sets(store_url: str) -> None:
    rng = random.Random(7)
    everything = [event_to_dict(e) for j in range(JOBS)
                  for e in job_events(f"cj{j}", steps=STEPS, t0=1_700_000_000.0 + 1000.0 * j)]
    # Each event goes to 2..4 writers, so every write races with others on the same ids
    # and the same job rows; batches mix jobs and arrive in each writer's own order.
    shares: list[list[dict[str, object]]] = [[] for _ in range(WRITERS)]
    for event in everything:
        for writer in rng.sample(range(WRITERS), rng.randint(2, WRITERS)):
            shares[writer].append(event)
    for share in shares:
        rng.shuffle(share)
        share.extend(share[: len(share) // 10])  # and some repeats of its own
    batches = [[share[i:i + 25] for i in range(0, len(share), 25)] for share in shares]

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WRITERS), ctx.Queue()
    procs = [ctx.Process(target=insert_worker, args=(store_url, b, barrier, results))
             for b in batches]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert all(isinstance(n, int) for n in outcomes), outcomes
    assert all(proc.exitcode == 0 for proc in procs)

    distinct_ids = {str(e["id"]) for e in everything}
    assert sum(outcomes) == len(distinct_ids)  # each id counted new exactly once
    with EttStore(store_url) as store:
        assert store.count_events() == len(distinct_ids)
        with store.engine.connect() as conn:
            ids = conn.execute(sa.select(events_table.c.id)).scalars().all()
            seqs = conn.execute(sa.select(events_table.c.seq)).scalars().all()
        assert set(ids) == distinct_ids and len(ids) == len(distinct_ids)
        assert len(set(seqs)) == len(seqs)
        for j in range(JOBS):
            row = store.get_job(f"cj{j}")
            expected = job_events(f"cj{j}", steps=STEPS, t0=1_700_000_000.0 + 1000.0 * j)
            assert row is not None
            assert row.version == len(expected) == store.count_events(f"cj{j}")
            assert (row.status, row.ended_ts, row.submitted_ts) == (
                "success", expected[-1].ts, 1_700_000_000.0 + 1000.0 * j)
            stored = store.job_events(f"cj{j}")
            assert [e.ts for e in stored] == sorted(e.ts for e in expected)
            assert sorted(stored, key=lambda e: e.id) == sorted(expected, key=lambda e: e.id)
