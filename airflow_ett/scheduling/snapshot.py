"""The fleet state a preemption decision sees, assembled from what Airflow and the ETT
store say (pure: the controller reads them, this turns the rows into `FleetState`).

Airflow says who waits and who holds GPUs: the train tasks in the tenants' pools
(`ett_tenant_<name>`: the cluster policy puts every lifecycle train task in its tenant's
pool, one slot per GPU). Scheduled or queued, a train task waits (since it was scheduled);
running, it holds its slots (since it started). The ETT store says where a running job
is in its attempt (`live.live_state`). A running job the store knows nothing of yet (its
trainer has not reported) is taken as in startup: never a victim. A task in a pool of a
tenant the file no longer names is left out (it holds GPUs the controller cannot weigh).

Yielding victims (a pending request in their job directory, `request.py`) are seen as the
fleet simulation sees them: their GPUs are promised to the request's `for_job`. So a
yielding victim is left out of `running`, and its `for_job`, while it still waits, is
shown running in startup on those GPUs (since the request): `victims.choose` neither
picks a second set of victims for it on the next look nor takes victims for another job
against GPUs already promised. `review_requests` sorts the pending requests first: which
to keep, which to withdraw (an `at_checkpoint` request whose `for_job` no longer waits,
before the victim is due to leave), which to escalate to `now` (an `at_checkpoint` one
past `leave_by` + grace + `OVERDUE_MARGIN_S`: its checkpoint never came) and which are
overdue (a `now` one past the same bound: the victim's worker may be gone). A request the
victim's trainer has claimed (it is leaving on it, `request.claim_request`) is yielding
like a pending one, its GPUs promised until the victim exits, but it is never withdrawn
(the trainer leaves anyway) nor escalated (it is leaving already): past the bound it is
overdue.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from airflow_ett.protocol.request import PreemptRequest
from airflow_ett.scheduling.live import LiveState, running_job
from airflow_ett.scheduling.model import (
    DEFAULT_WAIT_PRICE,
    POOL_PREFIX,
    FleetState,
    RunningJob,
    TenantPolicy,
    WaitingJob,
)

#: What a restart is taken to cost when a job's own history does not say (seconds).
DEFAULT_RESTART_S: Final = 300.0
#: A pending request this long past its `leave_by` and grace is overdue (seconds).
OVERDUE_MARGIN_S: Final = 30.0

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
                now: float, wait_price: float = DEFAULT_WAIT_PRICE,
                yielding: Mapping[str, PreemptRequest] | None = None) -> FleetState:
    """`live` maps a running task's job to its live state (None: nothing reported);
    `yielding` a yielding victim's job to its pending request (see the module docstring)."""
    yielding = yielding or {}
    promised: dict[str, float] = {}  # for_job -> when its GPUs were first promised
    for request in yielding.values():
        promised[request.for_job] = min(request.requested_at,
                                        promised.get(request.for_job, request.requested_at))
    waiting: list[WaitingJob] = []
    running: list[RunningJob] = []
    for task in tasks:
        tenant = tenant_of_pool(task.pool)
        policy = tenants.get(tenant) if tenant is not None else None
        if policy is None:
            continue
        gpus = max(1, task.pool_slots)
        if task.state == "running":
            if task.job not in yielding:
                running.append(_running(task, live.get(task.job), policy, gpus, now))
        elif task.job in promised:
            since = promised[task.job]
            running.append(RunningJob(
                job=task.job, tenant=policy.name, priority=policy.priority, gpus=gpus,
                stage="startup", run_s=max(0.0, now - since), since_checkpoint_s=None,
                saving=False, preemptions_today=0, restart_s=DEFAULT_RESTART_S,
                admitted_at=since))
        else:
            waiting.append(WaitingJob(job=task.job, tenant=policy.name,
                                      priority=policy.priority, gpus=gpus,
                                      waiting_since=task.since))
    return FleetState(now=now, capacity_gpus=max(capacity_gpus, sum(r.gpus for r in running)),
                      tenants=dict(tenants), waiting=tuple(waiting), running=tuple(running),
                      wait_price=wait_price)


@dataclass(frozen=True, slots=True)
class RequestReview:
    """What to do with the pending requests (victim job -> request): `yielding` stand (an
    escalated one as rewritten), `withdraw` are taken back, `escalate` rewritten as `now`
    (in `yielding` too), `overdue` are `now` requests nobody acted on (in `yielding`)."""

    yielding: dict[str, PreemptRequest] = field(default_factory=dict)
    withdraw: dict[str, PreemptRequest] = field(default_factory=dict)
    escalate: dict[str, PreemptRequest] = field(default_factory=dict)
    overdue: dict[str, PreemptRequest] = field(default_factory=dict)


def review_requests(pending: Mapping[str, PreemptRequest], tasks: Iterable[TrainTask], *,
                    now: float, claimed: Collection[str] = ()) -> RequestReview:
    """Sort the running victims' pending requests (see the module docstring); `claimed`:
    the victims whose request in `pending` their trainer claimed. A withdrawal comes only
    before `leave_by`: after it the victim's task is already making it leave at once, and
    taking the request back would not stop that."""
    waits = {t.job for t in tasks if t.state != "running"}
    review = RequestReview()
    for victim, request in sorted(pending.items()):
        late = now > request.leave_by + request.grace_s + OVERDUE_MARGIN_S
        if victim in claimed:
            if late:
                review.overdue[victim] = request
        elif request.mode == "at_checkpoint":
            if request.for_job not in waits and now <= request.leave_by:
                review.withdraw[victim] = request
                continue
            if late:
                # a save that fits (skip_save is a `now` decision's, never an escalation's)
                request = replace(request, mode="now", leave_by=now, skip_save=False)
                review.escalate[victim] = request
        elif late:
            review.overdue[victim] = request
        review.yielding[victim] = request
    return review


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
        job = replace(job, tenant=policy.name)
    return job
