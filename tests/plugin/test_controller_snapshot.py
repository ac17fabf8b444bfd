"""The preemption controller's look at the fleet (`airflow_ett.plugin.controller.snapshot`)
on a real SQLite ETT store: a running job that has not saved yet takes its tenant's recent
saves for its own (issue 22), so it can be asked to yield at the save it announced; the
train tasks are given (Airflow's metadata database is not needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ett.ett.events import (
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobSubmitted,
    Progress,
)
from airflow_ett.plugin.controller import snapshot
from airflow_ett.scheduling.model import TenantPolicy
from airflow_ett.scheduling.save_times import PRIOR_WINDOW_S
from airflow_ett.scheduling.snapshot import TrainTask
from airflow_ett.scheduling.tenants import TenantsConfig
from airflow_ett.scheduling.victims import choose
from airflow_ett.store import EttStore, upgrade

NOW = 1_800_000_000.0
TENANTS = {"ads": TenantPolicy(name="ads", priority=10, quota_gpus=2),
           "batch": TenantPolicy(name="batch", priority=1, quota_gpus=0, borrow_limit_gpus=2,
                                 min_run_s=0, grace_s=60.0)}
CONFIG = TenantsConfig(tenants=TENANTS, source="test", digest="0", capacity_gpus=2,
                       preemption=True, resume_after_s=5.0)


def task(job: str, state: str, pool: str) -> TrainTask:
    return TrainTask(job=job, dag_id=job, run_id="r", state=state,  # type: ignore[arg-type]
                     pool=pool, pool_slots=2, since=NOW - 600)


def saves(job: str, tenant: str, totals: list[float], *, at: float) -> list[Event]:
    """An earlier job of `tenant` whose saves (blocking 5 s each) committed up to `at`."""
    out: list[Event] = [JobSubmitted(id=f"{job}/s", job=job, ts=at - 3600, tenant=tenant)]
    for i, total in enumerate(totals):
        ts = at - 60.0 * (len(totals) - i)
        out.append(CheckpointSaved(id=f"{job}/c{i}", job=job, ts=ts, attempt="1",
                                   start_ts=ts - total, step=i, cursor=i, blocking_s=5.0,
                                   total_s=total))
    return out


def fresh(job: str, tenant: str, *, next_save: float) -> list[Event]:
    """A job training since NOW - 500 that has not saved; its spans say when it will."""
    return [JobSubmitted(id=f"{job}/s", job=job, ts=NOW - 600, tenant=tenant),
            AttemptStarted(id=f"{job}/a", job=job, ts=NOW - 500, attempt="1"),
            Progress(id=f"{job}/p", job=job, ts=NOW - 10, attempt="1", start_ts=NOW - 20,
                     step_start=0, step_end=10, cursor_start=0, cursor_end=10,
                     next_save_ts=next_save)]


@pytest.fixture
def store(tmp_path: Path) -> EttStore:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    return EttStore(url)


def test_a_job_that_never_saved_takes_its_tenants_recent_saves(store: EttStore) -> None:
    with store:
        store.insert_events([
            # batch's saves of the last day: 20, 40 and 60 s, 5 s of each blocking
            *saves("b0", "batch", [20.0, 40.0, 60.0], at=NOW - 3600),
            # older than the window: not counted
            *saves("b-old", "batch", [5000.0], at=NOW - PRIOR_WINDOW_S - 60),
            *fresh("b1", "batch", next_save=NOW + 100)])
        tasks = [task("b1", "running", "ett_tenant_batch"),
                 task("a1", "scheduled", "ett_tenant_ads")]
        state = snapshot(tasks, CONFIG, store, now=NOW)
    [b1] = state.running
    # its announced save plus batch's median save; the p90 as its exit save (56 s fits
    # the 60-s grace); the median commit past the blocking part
    assert (b1.next_checkpoint_in_s, b1.exit_save_s, b1.commit_wait_s) == (
        pytest.approx(100 + 40), pytest.approx(56.0), 35.0)
    [p] = choose(state)[0].preemptions
    assert (p.victim, p.mode, p.yield_in_s) == ("b1", "at_checkpoint", pytest.approx(140))


def test_a_tenant_without_recent_saves_leaves_the_job_unknown(store: EttStore) -> None:
    with store:
        store.insert_events([*saves("x0", "ads", [20.0], at=NOW - 3600),  # another tenant
                             *fresh("b1", "batch", next_save=NOW + 100)])
        tasks = [task("b1", "running", "ett_tenant_batch"),
                 task("a1", "scheduled", "ett_tenant_ads")]
        state = snapshot(tasks, CONFIG, store, now=NOW)
    [b1] = state.running
    assert (b1.next_checkpoint_in_s, b1.exit_save_s, b1.commit_wait_s) == (None, None, None)
    [p] = choose(state)[0].preemptions
    assert p.mode == "now"
