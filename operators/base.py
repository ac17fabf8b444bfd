"""What the lifecycle operators share: the job's identity, files and emitter.

Thin on purpose: the decisions live in `job.py` (config), the trainer's launcher (exit
codes, restarts) and the ETT model; an operator wires Airflow's context to them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_ett.emit import Emitter, get_emitter
from airflow_ett.jobs import job_id_for
from airflow_ett.operators.job import (
    MAX_NPROC,
    JobPaths,
    TrainerSpec,
    check_trainer_config,
    check_work_dir,
    job_paths,
    materialize,
    reader,
)
from airflow_ett.operators.tracing import trainer_trace_env
from airflow_ett.protocol.env import CHECKPOINT_DIR_ENV, JOB_DIR_ENV
from airflow_ett.settings import EttSettings
from airflow_ett.trainer.config import TrainerConfig

if TYPE_CHECKING:
    from airflow.sdk import Context


class EttJobOperator(BaseOperator):
    """Base of the lifecycle operators: a task of one training job.

    :param nproc: trainer processes (1: alone; more: under torchrun).
    :param work_dir: where job files, the compile cache and models live; default
        `[ett] work_dir`.
    :param record: False turns ETT recording off for this task and its trainer.
    """

    ett_role = ""
    ui_color = "#e8f4ea"

    def __init__(self, *, nproc: int = 1, work_dir: str | None = None, record: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        r = reader(type(self).__name__)
        self.nproc = r.integer("nproc", nproc, minimum=1, maximum=MAX_NPROC)
        self.work_dir = check_work_dir(type(self).__name__, work_dir)
        self.record = r.boolean("record", record)

    # -- per-run helpers (execute time) --------------------------------------------------

    @staticmethod
    def run_ids(context: Context) -> tuple[str, str]:
        ti = context["ti"]
        return str(ti.dag_id), str(ti.run_id)

    def job_id(self, context: Context) -> str:
        return job_id_for(*self.run_ids(context))

    def paths(self, context: Context) -> JobPaths:
        root = Path(self.work_dir).expanduser() if self.work_dir else EttSettings.load().work_dir
        return job_paths(root, *self.run_ids(context))

    def emitter(self, context: Context, attempt: str | None = None) -> Emitter:
        base = get_emitter() if self.record else Emitter(disabled=True)
        return base.bind(self.job_id(context), attempt)

    def child_env(self, paths: JobPaths | None = None) -> dict[str, str]:
        """What the trainer gets on top of the task's environment ([ett] included).

        Inductor's local cache goes in the job's directory (unless the worker sets
        `TORCHINDUCTOR_CACHE_DIR` itself): a job's in-place restarts and retries on the
        same worker share it, but another job on this worker does not, as on a fleet where
        each job lands on its own hosts. Compiles are then shared across jobs only
        through the compile cache (which points inductor at its own directory), so a job
        with the cache off really starts cold and the comparison with it is honest.

        With Airflow's tracing on, the task's trace context too (`tracing.py`).
        """
        env = {} if self.record else {"AIRFLOW__ETT__DISABLED": "True"}
        if self.record:  # the task's trace context: the trainer's spans go under it
            env.update(trainer_trace_env())
        if paths is not None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(paths.job_dir / "inductor")
        if paths is not None:  # where a preemption request is left (protocol/request.py)
            env[JOB_DIR_ENV] = str(paths.job_dir)
            env[CHECKPOINT_DIR_ENV] = str(paths.checkpoint_dir)
        return env


class EttTrainerOperator(EttJobOperator):
    """A task that runs our trainer's config (prewarm, train, publish).

    :param trainer_config: the trainer's config (see `airflow_ett.trainer.config`), minus
        the paths the operators manage; validated when the DAG file is parsed.
    """

    def __init__(self, *, trainer_config: TrainerSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_trainer_config(trainer_config, nproc=self.nproc)
        self.trainer_config = TrainerSpec(**trainer_config)

    def prepare(self, context: Context) -> tuple[JobPaths, TrainerConfig]:
        """The job's files and its trainer config with the run's params applied."""
        paths = self.paths(context)
        cfg = materialize(self.trainer_config, context.get("params"), paths)
        return paths, cfg
