"""The fleet state the controller hands to `victims.choose`, from Airflow's train tasks
and the store's live states (`airflow_ett.scheduling.snapshot`)."""

from __future__ import annotations

from airflow_ett.scheduling.live import LiveState
from airflow_ett.scheduling.model import TenantPolicy
from airflow_ett.scheduling.snapshot import DEFAULT_RESTART_S, TrainTask, fleet_state
from airflow_ett.scheduling.victims import choose

NOW = 1_800_000_000.0
TENANTS = {"ads": TenantPolicy(name="ads", priority=10, quota_gpus=4),
           "batch": TenantPolicy(name="batch", priority=1, quota_gpus=0, borrow_limit_gpus=4,
                                 min_run_s=0)}


def task(job: str, state: str, pool: str, slots: int = 2, since: float = NOW - 600
         ) -> TrainTask:
    return TrainTask(job=job, dag_id=job, run_id="r", state=state,  # type: ignore[arg-type]
                     pool=pool, pool_slots=slots, since=since)


def live(job: str, tenant: str = "batch", stage: str = "training") -> LiveState:
    return LiveState(job=job, tenant=tenant, model="m", attempt="1.1",
                     stage=stage,  # type: ignore[arg-type]
                     saving=False, run_s=500.0, since_checkpoint_s=40.0,
                     preemptions_today=0, restart_s=120.0, admitted_at=NOW - 500,
                     last_event_at=NOW - 1)


def test_waiting_and_running_tasks_become_the_fleet_state() -> None:
    tasks = [task("b1", "running", "ett_tenant_batch", 4),
             task("a1", "scheduled", "ett_tenant_ads", 4, since=NOW - 30),
             task("a2", "queued", "ett_tenant_ads", 2, since=NOW - 10),
             task("x", "running", "default_pool", 1),  # not a tenant's train task
             task("gone", "running", "ett_tenant_retired", 1)]  # tenant no longer in file
    state = fleet_state(tasks, {"b1": live("b1")}, TENANTS, capacity_gpus=4, now=NOW)
    assert [(w.job, w.tenant, w.priority, w.gpus, w.waiting_since) for w in state.waiting] == [
        ("a1", "ads", 10, 4, NOW - 30), ("a2", "ads", 10, 2, NOW - 10)]
    (b1,) = state.running
    assert (b1.job, b1.tenant, b1.priority, b1.gpus, b1.stage, b1.since_checkpoint_s) == (
        "b1", "batch", 1, 4, "training", 40.0)
    assert state.free_gpus == 0
    decision = choose(state)[0]
    assert decision.for_job == "a1" and [p.victim for p in decision.preemptions] == ["b1"]


def test_a_running_job_nothing_has_reported_for_is_in_startup() -> None:
    tasks = [task("b1", "running", "ett_tenant_batch", 4, since=NOW - 90),
             task("a1", "scheduled", "ett_tenant_ads", 4)]
    state = fleet_state(tasks, {"b1": None}, TENANTS, capacity_gpus=4, now=NOW)
    (b1,) = state.running
    assert (b1.stage, b1.run_s, b1.restart_s, b1.admitted_at) == (
        "startup", 90.0, DEFAULT_RESTART_S, NOW - 90)
    (decision,) = choose(state)
    assert decision.preemptions == ()  # never a victim in startup
    assert "startup" in decision.reason


def test_the_pool_decides_the_tenant_and_capacity_covers_what_runs() -> None:
    # the store says another tenant (a renamed tag): the pool holds the slots, it wins
    state = fleet_state([task("b1", "running", "ett_tenant_batch", 4)],
                        {"b1": live("b1", tenant="ads")}, TENANTS, capacity_gpus=2, now=NOW)
    assert state.running[0].tenant == "batch" and state.running[0].priority == 1
    assert state.capacity_gpus == 4  # never less than what is held
