"""What the cluster policies decide, as pure functions: the rules a lifecycle DAG must
follow (checked when its file is parsed), the Airflow settings each of its tasks gets
from its tenant, and the aged priority weight.

The glue (`airflow_ett/plugin/policy.py`, `plugin/priority.py`) turns Airflow's DAG and
task objects into the plain facts below and applies the answers; nothing here opens a
database session or imports Airflow, so the policies stay fast inside the DAG processor
and the scheduler.

Aging, without recomputing anything: Airflow computes a task instance's priority weight
once, when the instance is created (and again when it is cleared), and the scheduler
orders queued work by it. A weight that grows with the waiting time would need updating
every loop. But "priority + aging x time waited" orders two tasks the same way at every
moment as the static `priority - aging x arrival time` does (the difference between two
tasks does not depend on the moment compared), so the weight is computed once from the
run's arrival: an old low-priority run overtakes a new high-priority one after
`(p_high - p_low) / aging` hours, whenever the scheduler looks, and no tenant starves.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from airflow_ett.scheduling.model import TenantPolicy

#: Priority points per tenant priority unit, so aging (points per hour, fractional) has
#: room below one unit of priority: weight = priority * SCALE - aging * SCALE * hours.
SCALE: Final = 100
#: Hours are counted from here (keeps the weights small: Airflow stores them as int32).
EPOCH: Final = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
INT32_MAX: Final = 2**31 - 1
#: The lifecycle roles (operators/lifecycle.py's task ids).
ROLES: Final = ("prewarm", "train", "publish")


class PolicyViolation(ValueError):
    """A lifecycle DAG that breaks the fleet's rules; the message is for its model owner."""


@dataclass(frozen=True, slots=True)
class LifecycleTask:
    """What the policy needs of one lifecycle task."""

    task_id: str
    role: str  # one of ROLES
    queue: str
    retries: int


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """What a lifecycle task gets from its tenant (None: left as the DAG says)."""

    queue: str
    priority_weight: int
    pool: str | None = None
    pool_slots: int | None = None


def check_dag(dag_id: str, tenant: str | None, tasks: list[LifecycleTask],
              tenants: Mapping[str, TenantPolicy], *, gpu_queue: str) -> None:
    """Raise `PolicyViolation` naming every rule the DAG breaks, in words a model owner
    can act on; the DAG is then not loaded (it shows among the import errors)."""
    problems = []
    known = ", ".join(sorted(tenants)) or "(none)"
    if not tenant:
        problems.append(f"it names no tenant: pass tenant=... to training_job() (one of "
                        f"{known})")
    elif tenant not in tenants:
        hint = (" (training_job() says 'default' when no tenant=... is given)"
                if tenant == "default" else "")
        problems.append(f"tenant {tenant!r} is not in the tenants file (known: {known}){hint}; "
                        "ask the platform team to add it, or fix the name")
    for task in tasks:
        if task.role == "train" and task.retries < 1:
            problems.append(f"task {task.task_id!r} trains without retries: a preemption or "
                            "an infrastructure failure would end the job; set retries >= 1")
        if task.role in ("prewarm", "publish") and task.queue == gpu_queue:
            problems.append(f"task {task.task_id!r} ({task.role}) runs on the GPU queue "
                            f"{gpu_queue!r}: it needs no GPU, so it would hold one idle; "
                            "use the CPU queue")
    if problems:
        raise PolicyViolation(f"DAG {dag_id!r} breaks the training fleet's rules: "
                              + " ".join(f"({i}) {p}." for i, p in enumerate(problems, 1)))


def task_settings(role: str, policy: TenantPolicy, *, gpus: int, gpu_queue: str,
                  cpu_queue: str) -> TaskSettings:
    """The train task runs in its tenant's pool, one slot per GPU, on the GPU queue; the
    CPU tasks on the CPU queue, outside any GPU pool. All of them carry the tenant's
    priority (the aged weight is computed from it by the priority strategy)."""
    if role not in ROLES:
        raise ValueError(f"role: {role!r} is not one of {list(ROLES)}")
    if gpus < 1:
        raise ValueError(f"gpus: {gpus!r} is not a positive GPU count")
    if role == "train":
        return TaskSettings(queue=gpu_queue, priority_weight=policy.priority, pool=policy.pool,
                            pool_slots=gpus)
    return TaskSettings(queue=cpu_queue, priority_weight=policy.priority)


def aged_weight(priority: int, arrived_at: float, aging_per_hour: float) -> int:
    """`priority * SCALE - aging_per_hour * SCALE * hours since EPOCH`, clamped to int32
    (see the module docstring: a static weight that orders like aging)."""
    hours = (arrived_at - EPOCH) / 3600.0
    weight = round(priority * SCALE - aging_per_hour * SCALE * hours)
    return max(-INT32_MAX, min(INT32_MAX, weight))


_RUN_ID_TIME = re.compile(r"^[a-z_]+__(\d{4}-\d{2}-\d{2}T[0-9:.]+(?:[+-]\d{2}:\d{2}|Z)?)")


def arrival_of_run(run_id: str | None, fallback: float) -> float:
    """When a DAG run arrived, from its id (`manual__2026-12-01T10:00:00+00:00`,
    `scheduled__...`, `backfill__...`, `asset_triggered__...`): the same for every try of
    the run, so a retry after a preemption keeps the age it had. `fallback` (now) for an
    id without a time (a custom run id)."""
    found = _RUN_ID_TIME.match(run_id or "")
    if found is None:
        return fallback
    try:
        when = dt.datetime.fromisoformat(found.group(1).replace("Z", "+00:00"))
    except ValueError:
        return fallback
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()
