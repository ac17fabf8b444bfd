"""`EttTenantPriority`: the priority weight strategy of lifecycle tasks (registered by the
plugin, set on them by the cluster policy): the tenant's priority, aged by how long the
DAG run has waited, so that no tenant starves (`scheduling/rules.py` says how a weight
computed once can age).

Airflow calls `get_weight` when it creates a task instance and when it clears one (a
preemption clears the train task), inside the scheduler's or the DAG processor's work:
it reads the tenants file through the one-`stat` cache and nothing else, and never
raises (a broken tenants file keeps its last good aging, none means the default).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from airflow.task.priority_strategy import PriorityWeightStrategy

from airflow_ett.scheduling.rules import aged_weight, arrival_of_run

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

log = logging.getLogger(__name__)


def aging_per_hour() -> float:
    """The tenants file's `[scheduling] aging_per_hour` in force, or the default."""
    from airflow_ett.scheduling import tenants

    try:
        path = tenants.tenants_file_from_settings()
        state = tenants.current(path) if path is not None else None
    except Exception:  # a weight must be computed whatever the configuration says
        log.exception("airflow_ett: cannot read the tenants file; default aging")
        state = None
    if state is None or state.config is None:
        return tenants.DEFAULT_AGING_PER_HOUR
    return state.config.aging_per_hour


class EttTenantPriority(PriorityWeightStrategy):
    """The task's priority weight (its tenant's priority, set by the cluster policy),
    aged from its DAG run's arrival at the tenants file's `aging_per_hour`."""

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        base = int(getattr(task, "priority_weight", 1) or 0) if task is not None else 1
        arrived = arrival_of_run(getattr(ti, "run_id", None), time.time())
        return aged_weight(base, arrived, aging_per_hour())
