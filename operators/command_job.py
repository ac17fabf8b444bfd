"""`training_job(command=[...])`: a lifecycle DAG around any trainer command.

The DAG is the train task alone (`CommandTrainOperator` on the GPU queue): there is no
compile cache of ours to prewarm, and publishing is the command's own (it writes its
model where it writes it). What the job gets is everything the train task does for any
trainer: in-place restarts, cause classification, preemption on request and at a
checkpoint, the job's boundaries, Level 1 from attempts (and from log lines with
`progress_pattern`), Level 2 from an adapter (docs/trainer-protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from airflow.sdk import DAG

from airflow_ett.jobs import tags_for
from airflow_ett.operators.job import JobConfigError, Placement, reader
from airflow_ett.operators.train import CommandTrainOperator, check_command

if TYPE_CHECKING:
    from airflow.sdk.definitions.dag import ScheduleArg

#: What a command job's DAG documents for its one task.
TASK_DOC: Final = ("Runs the trainer command on the GPU queue: restarts it in place on a "
                   "failure (then Airflow retries), leaves on a preemption request, and "
                   "records every attempt; its end is when the job releases its GPUs.")


def _dag_doc(tenant: str, model: str, command: Sequence[str], record: bool) -> str:
    shown = " ".join(command)
    recorded = ("Every attempt is recorded for ETT%: see the run's **ETT breakdown** view."
                if record else "ETT recording is off for this DAG (`record=False`).")
    return f"""\
### Training job `{model}` (tenant `{tenant}`): a trainer command

A lifecycle built by `airflow_ett.operators.training_job(command=...)`, run in the DAG
file's folder. {recorded}

| task | what it does |
|---|---|
| `train` | {TASK_DOC} |

Command: `{shown[:500]}`
"""


def command_job(dag_id: str, *, command: Sequence[str], model: object, tenant: str,
                schedule: ScheduleArg, start_date: datetime | None, retries: int,
                retry_delay: timedelta, restarts: int, nproc: int, queues: Mapping[str, str],
                pools: Mapping[str, str], work_dir: str | None, record: bool,
                tags: Sequence[str], grace_s: float, progress_pattern: str | None,
                env: Mapping[str, str] | None, cwd: str, ours: Mapping[str, object],
                **dag_kwargs: Any) -> DAG:
    """The DAG of a command job; `ours` are `training_job`'s parameters for our trainer
    that were given (each refused by name: a command job has none of them)."""
    given = sorted(name for name, value in ours.items() if value not in (None, (), {}))
    if given:
        raise JobConfigError(f"training_job: {given} configure our trainer; a job given "
                             "a command runs that command (put its options in it)")
    r = reader("training_job")
    command = check_command("training_job", command)
    if isinstance(model, Mapping):
        raise r.fail("model", model, "must be a name (a command job's model is only its "
                                     "label)")
    label = dag_id if model is None else r.text("model", model, max_len=80)
    unknown = sorted((set(queues) | set(pools)) - {"train"})
    if unknown:
        raise JobConfigError(f"training_job: queues/pools {unknown}: a command job has "
                             "one task, 'train'")
    dag_tags = [*tags_for(tenant, label, record=record, gpus=nproc), *tags]
    dag_kwargs.setdefault("doc_md", _dag_doc(tenant, label, command, record))
    placement: Placement = {"queue": queues.get("train", "gpu")}
    if "train" in pools:
        placement["pool"] = pools["train"]
    with DAG(dag_id, schedule=schedule, start_date=start_date, tags=dag_tags,
             **dag_kwargs) as dag:
        CommandTrainOperator(
            task_id="train", command=command, restarts=restarts, retries=retries,
            retry_delay=retry_delay, nproc=nproc, work_dir=work_dir, record=record,
            grace_s=grace_s, progress_pattern=progress_pattern, env=env, cwd=cwd,
            doc_md=TASK_DOC,
            **placement)
    return dag
