"""Event factories and multiprocessing workers shared by the store tests.

A module of its own (not conftest) so that spawned worker processes can import it by name.
"""

from __future__ import annotations

from typing import Any

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
)


def job_events(job: str, *, t0: float = 1_700_000_000.0, steps: int = 5,
               tenant: str = "ads", model: str = "dlrm_small", dag_id: str = "ranking",
               ended: bool = True) -> list[Event]:
    """A small, valid lifecycle of one job: submit, one attempt with init, progress and a
    checkpoint, then (optionally) the end. Event ids are unique per job."""
    out: list[Event] = [
        JobSubmitted(id=f"{job}/submit", job=job, ts=t0, tenant=tenant, model=model,
                     dag_id=dag_id, run_id=f"run-{job}", attrs={"owner": "me", "n": 1}),
        AttemptStarted(id=f"{job}/a1", job=job, ts=t0 + 5, attempt="a1", host="h1"),
        PhaseStarted(id=f"{job}/init+", job=job, ts=t0 + 5.5, phase="trainer_init",
                     attempt="a1"),
        PhaseEnded(id=f"{job}/init-", job=job, ts=t0 + 8.25, phase="trainer_init",
                   attempt="a1"),
    ]
    t = t0 + 10
    for i in range(steps):
        out.append(Progress(id=f"{job}/p{i}", job=job, ts=t + 1, attempt="a1", start_ts=t,
                            step_start=i * 10, step_end=(i + 1) * 10,
                            cursor_start=i * 100, cursor_end=(i + 1) * 100, loss=0.5 / (i + 1)))
        t += 1
    out.append(CheckpointSaved(id=f"{job}/ckpt", job=job, ts=t + 0.5, attempt="a1",
                               start_ts=t, step=steps * 10, cursor=steps * 100,
                               blocking_s=0.25, total_s=0.5, bytes=1024, final=True))
    if ended:
        out.append(AttemptEnded(id=f"{job}/a1-end", job=job, ts=t + 1, attempt="a1",
                                status="success"))
        out.append(JobEnded(id=f"{job}/end", job=job, ts=t + 1, status="success"))
    return out


def many_events(job: str, n: int, *, t0: float = 1_700_000_000.0) -> list[Event]:
    """`n` events of one job, mostly progress: cheap to build in bulk for load tests."""
    out: list[Event] = [JobSubmitted(id=f"{job}/submit", job=job, ts=t0, tenant="bench")]
    for i in range(n - 1):
        start = t0 + 1 + i
        out.append(Progress(id=f"{job}/p{i}", job=job, ts=start + 1, attempt="a1",
                            start_ts=start, step_start=i, step_end=i + 1,
                            cursor_start=i, cursor_end=i + 1))
    return out


def insert_worker(url: str, batches: list[list[dict[str, Any]]], barrier: Any,
                  results: Any) -> None:
    """Insert `batches` (events as dicts) into the store at `url`; report how many were
    new. Runs in a spawned process: everything arrives pickled, as plain data."""
    from airflow_ett.ett.events import event_from_dict
    from airflow_ett.store import EttStore

    parsed = [[event_from_dict(e) for e in batch] for batch in batches]
    store = EttStore(url)
    try:
        store.ping()
        barrier.wait(timeout=60)
        results.put(sum(store.insert_events(batch) for batch in parsed))
    except BaseException as exc:
        results.put(repr(exc))
        raise
    finally:
        store.close()


def upgrade_worker(url: str, barrier: Any, results: Any) -> None:
    from airflow_ett.store import upgrade

    try:
        barrier.wait(timeout=60)
        upgrade(url)
        results.put("ok")
    except BaseException as exc:
        results.put(repr(exc))
        raise
