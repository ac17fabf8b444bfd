"""How Airflow's objects map onto ETT jobs and attempts, in one place.

A job is one DAG run of a lifecycle DAG; an attempt is one start of the trainer, inside
one Airflow try of the train task. Listeners (in the scheduler, on workers, in the API
server) and operators name the same job and attempt independently, without talking to
each other, so the names must be pure functions of what every one of them can see.
Which DAGs are recorded, and for which tenant and model, is written in the DAG's tags,
since tags are the one DAG attribute the scheduler, the worker and the UI all have.
No Airflow import: the trainer side and tests use this too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

ETT_TAG: Final = "ett"
"""A DAG carrying this tag is recorded by the listeners (the lifecycle factory adds it)."""
TENANT_TAG: Final = "ett:tenant="
MODEL_TAG: Final = "ett:model="
GPUS_TAG: Final = "ett:gpus="
"""The job's world size (GPUs, one per trainer process): what its GPU-hours weigh by."""


def job_id_for(dag_id: str, run_id: str) -> str:
    """`<dag_id>__<run_id>`: readable in `airflow-ett runs list`, unique per DAG run."""
    return f"{dag_id}__{run_id}"


def attempt_id_for(try_number: int, restart: int) -> str:
    """`<try>.<restart>`: the Airflow try and the in-place restart within it (both 1-based),
    so an attempt's id says which try of the task it belonged to."""
    return f"{try_number}.{restart}"


@dataclass(frozen=True, slots=True)
class DagRecording:
    """What a DAG's tags say about recording it."""

    recorded: bool
    tenant: str = "default"
    model: str = ""
    gpus: int = 1


def recording_of(tags: Iterable[str] | None) -> DagRecording:
    tag_set = set(tags or ())
    tenant, model, gpus = "default", "", 1
    for tag in tag_set:
        if tag.startswith(TENANT_TAG):
            tenant = tag[len(TENANT_TAG):] or tenant
        elif tag.startswith(MODEL_TAG):
            model = tag[len(MODEL_TAG):]
        elif tag.startswith(GPUS_TAG):
            gpus = _gpus(tag[len(GPUS_TAG):])
    return DagRecording(ETT_TAG in tag_set, tenant, model, gpus)


def _gpus(text: str) -> int:
    """A tag's GPU count; 1 for one that is not a positive integer. The factory writes the
    tag from its checked `nproc`, so only a hand-made tag can be odd, and a listener must
    never fail the DAG run it observes (the submission event then says world size 1)."""
    return int(text) if text.isdigit() and 0 < int(text) <= 1 << 20 else 1


def tags_for(tenant: str, model: str, *, record: bool = True, gpus: int = 1) -> list[str]:
    tags = [f"{TENANT_TAG}{tenant}", f"{MODEL_TAG}{model}", f"{GPUS_TAG}{gpus}"]
    return [ETT_TAG, *tags] if record else tags
