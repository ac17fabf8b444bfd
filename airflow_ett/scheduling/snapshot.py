"""The fleet state a preemption decision sees, assembled from what Airflow and the ETT
store say (pure: the controller reads them, this turns the rows into `FleetState`).

Airflow says who waits and who holds GPUs: the train tasks in the tenants' pools
(`ett_tenant_<name>`: the cluster policy puts every lifecycle train task in its tenant's
pool, one slot per GPU). Scheduled or queued, a train task waits (since it was scheduled);
running, it holds its slots (since it started). The ETT store says where a running job
is in its attempt (`live.live_state`). A running job the store knows nothing of yet (its
trainer has not reported) is taken as in startup: never a victim. A task in a pool of a
tenant the file no longer names is left out (it holds GPUs the controller cannot weigh).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from airflow_ett.scheduling.live import LiveState, running_job
from airflow_ett.scheduling.model import (
    POOL_PREFIX,
    FleetState,
    RunningJob,
    TenantPolicy,
    WaitingJob,
)

#: What a restart is taken to cost when a job's own history does not say (seconds).
DEFAULT_RESTART_S: Final = 300.0

TaskState = Literal["scheduled", "queued", "running"]


@dataclass(frozen=True, slots=True)
class TrainTask:
    """A train task instance as Airflow has it (`airflow_ett/plugin/controller.py`)."""

    job: str  # `jobs.job_id_for(dag_id, run_id)`
    dag_id: str
    run_id: str
    state: TaskState
    pool: str
    pool_slots: int
    since: float  # scheduled/queued: when it started waiting; running: when it started


def tenant_of_pool(pool: str) -> str | None:
    return pool[len(POOL_PREFIX):] if pool.startswith(POOL_PREFIX) else None


def fleet_state(tasks: Iterable[TrainTask], live: Mapping[str, LiveState | None],
                tenants: Mapping[str, TenantPolicy], *, capacity_gpus: int,
                now: float) -> FleetState:
    """`live` maps a running task's job to its live state (None: nothing reported)."""
    waiting: list[WaitingJob] = []
    running: list[RunningJob] = []
    for task in tasks:
        tenant = tenant_of_pool(task.pool)
        policy = tenants.get(tenant) if tenant is not None else None
        if policy is None:
            continue
        gpus = max(1, task.pool_slots)
        if task.state == "running":
            running.append(_running(task, live.get(task.job), policy, gpus, now))
        else:
            waiting.append(WaitingJob(job=task.job, tenant=policy.name,
                                      priority=policy.priority, gpus=gpus,
                                      waiting_since=task.since))
    return FleetState(now=now, capacity_gpus=max(capacity_gpus, sum(r.gpus for r in running)),
                      tenants=dict(tenants), waiting=tuple(waiting), running=tuple(running))


def _running(task: TrainTask, state: LiveState | None, policy: TenantPolicy, gpus: int,
             now: float) -> RunningJob:
    if state is None:
        return RunningJob(job=task.job, tenant=policy.name, priority=policy.priority,
                          gpus=gpus, stage="startup", run_s=max(0.0, now - task.since),
                          since_checkpoint_s=None, saving=False, preemptions_today=0,
                          restart_s=DEFAULT_RESTART_S, admitted_at=task.since)
    job = running_job(state, priority=policy.priority, gpus=gpus,
                      default_restart_s=DEFAULT_RESTART_S)
    if job.tenant != policy.name:  # the pool decides: it is what holds the slots
        from dataclasses import replace

        job = replace(job, tenant=policy.name)
    return job
