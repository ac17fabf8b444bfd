"""The cluster policies (entry point `airflow.policy`): lifecycle DAGs follow the tenants
file.

- `dag_policy` rejects a lifecycle DAG that breaks the fleet's rules (no tenant, an
  unknown one, a train task without retries, a CPU task on the GPU queue), with a
  message for its model owner: Airflow then lists the file among its import errors.
  For a tenant with a time-to-start bound (`max_tts_s`) it adds the deadline alert that
  flags a run still waiting past it (`plugin/tts_watch.py`).
- `task_policy` gives each lifecycle task its tenant's settings: the train task its
  tenant's pool (one slot per GPU), the GPU queue and the tenant's priority; prewarm and
  publish the CPU queue and the priority; all of them the aged priority strategy
  (`plugin/priority.py`).

Airflow calls both in the DAG processor for every DAG it parses; they read the tenants
file through a cache that costs one `stat` when the file is unchanged, open no database
session, and raise nothing but the policy violation: with no `[ett] tenants_file` they do
nothing, and with a file that is broken the last good version stays in force (never
valid: they do nothing, and the error is logged), so a bad edit never stops DAGs from
loading. The decisions themselves are `airflow_ett/scheduling/rules.py`'s.

A lifecycle task is one of our operators (prewarm, train, publish), whoever built the DAG;
other tasks in the same DAG are left as they are.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.policies import hookimpl

if TYPE_CHECKING:
    from airflow_ett.scheduling.rules import LifecycleTask
    from airflow_ett.scheduling.tenants import TenantsConfig

log = logging.getLogger(__name__)


def _config() -> TenantsConfig | None:
    """The tenants in force, or None (no file configured, or never a valid one)."""
    from airflow_ett.scheduling import tenants

    try:
        path = tenants.tenants_file_from_settings()
        if path is None:
            return None
        return tenants.current(path).config
    except Exception:
        log.exception("airflow_ett: the tenants file cannot be read; cluster policies off")
        return None


def _role(task: Any) -> str | None:
    from airflow_ett.operators.prewarm import CompileCachePrewarmOperator
    from airflow_ett.operators.publish import PublishModelOperator
    from airflow_ett.operators.train import CommandTrainOperator

    # CommandTrainOperator is every train task's class: a command job's (your trainer)
    # and, as its subclass, TorchRecTrainOperator (ours).
    for cls, role in ((CommandTrainOperator, "train"), (CompileCachePrewarmOperator, "prewarm"),
                      (PublishModelOperator, "publish")):
        if isinstance(task, cls):
            return role
    return None


def _tenant_of(tags: Any) -> str | None:
    from airflow_ett.jobs import TENANT_TAG

    for tag in tags or ():
        if isinstance(tag, str) and tag.startswith(TENANT_TAG):
            return tag[len(TENANT_TAG):] or None
    return None


def _lifecycle_tasks(dag: Any) -> list[LifecycleTask]:
    from airflow_ett.scheduling.rules import LifecycleTask

    out = []
    for task in dag.tasks:
        role = _role(task)
        if role is not None:
            out.append(LifecycleTask(task.task_id, role, str(task.queue),
                                     int(task.retries or 0)))
    return out


@hookimpl
def dag_policy(dag: Any) -> None:
    from airflow.exceptions import AirflowClusterPolicyViolation

    from airflow_ett.scheduling.rules import PolicyViolation, check_dag

    config = _config()
    if config is None:
        return
    try:
        tasks = _lifecycle_tasks(dag)
        if not tasks:
            return
        tenant = _tenant_of(dag.tags)
        check_dag(dag.dag_id, tenant, tasks, config.tenants, gpu_queue=config.default_queue)
        if tenant is not None:
            _watch_time_to_start(dag, tenant, config.tenants[tenant].max_tts_s)
    except PolicyViolation as exc:
        raise AirflowClusterPolicyViolation(str(exc)) from None
    except Exception:  # a bug here must not stop the DAG from loading
        log.exception("airflow_ett: dag_policy failed on DAG %s; left as it is",
                      getattr(dag, "dag_id", "?"))


def _watch_time_to_start(dag: Any, tenant: str, bound_s: float | None) -> None:
    """The tenant's time-to-start deadline on the DAG (replacing one an earlier parse or
    version put there), beside the DAG's own deadlines; none without a bound."""
    from airflow_ett.plugin.tts_watch import DEADLINE_NAME, deadline_alert

    own = [d for d in (dag.deadline or []) if getattr(d, "name", None) != DEADLINE_NAME]
    if bound_s is not None:
        own.append(deadline_alert(tenant, bound_s))
    dag.deadline = own or None


@hookimpl
def task_policy(task: Any) -> None:
    config = _config()
    if config is None:
        return
    try:
        _apply(task, config)
    except Exception:
        log.exception("airflow_ett: task_policy failed on task %s; left as it is",
                      getattr(task, "task_id", "?"))


def _apply(task: Any, config: TenantsConfig) -> None:
    from airflow_ett.jobs import recording_of
    from airflow_ett.plugin.priority import EttTenantPriority
    from airflow_ett.scheduling.rules import task_settings

    role = _role(task)
    dag = getattr(task, "dag", None)
    if role is None or dag is None:
        return
    tenant = _tenant_of(dag.tags)
    if tenant is None or tenant not in config.tenants:
        return  # dag_policy has rejected the DAG already
    settings = task_settings(role, config.tenants[tenant], gpus=recording_of(dag.tags).gpus,
                             gpu_queue=config.default_queue, cpu_queue=config.cpu_queue)
    task.queue = settings.queue
    task.priority_weight = settings.priority_weight
    task.weight_rule = EttTenantPriority()
    if settings.pool is not None:
        task.pool = settings.pool
    if settings.pool_slots is not None:
        task.pool_slots = settings.pool_slots
