"""`training_job(...)`: a whole lifecycle DAG from one call.

prewarm compile cache (CPU) -> train (GPU; in-place restarts, then retries) -> publish
(CPU). A model owner states the job; the factory chooses the tasks, queues, retry
policy and trigger-form params, and every option is checked when the DAG file is parsed
so that a typo fails in the DAG processor's import errors, not an hour into a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from airflow.sdk import DAG, Param

from airflow_ett.jobs import tags_for
from airflow_ett.operators.job import FAULT_KINDS, JobConfigError, check_trainer_config
from airflow_ett.operators.prewarm import CompileCachePrewarmOperator
from airflow_ett.operators.publish import PublishModelOperator
from airflow_ett.operators.train import TorchRecTrainOperator

TRAINER_OPTIMIZATIONS: Final = ("fast_batch", "parallel_init", "compile_cache",
                                "async_checkpoint")
OPTIMIZATIONS: Final = (*TRAINER_OPTIMIZATIONS, "standalone_publish")
ROLES: Final = ("prewarm", "train", "publish")
TASK_IDS: Final = {"prewarm": "prewarm_compile_cache", "train": "train",
                   "publish": "publish_model"}
DEFAULT_QUEUES: Final = {"prewarm": "cpu", "train": "gpu", "publish": "cpu"}


def _roles_mapping(name: str, value: Mapping[str, str] | None) -> dict[str, str]:
    value = dict(value or {})
    unknown = sorted(set(value) - set(ROLES))
    if unknown:
        raise JobConfigError(f"training_job: {name} has unknown key(s) {unknown}; known: "
                             f"{list(ROLES)}")
    for key, item in value.items():
        if not isinstance(item, str) or not item:
            raise JobConfigError(f"training_job: {name}[{key!r}] = {item!r}: must be a "
                                 "non-empty string")
    return value


def _optimizations(value: Mapping[str, bool] | None) -> dict[str, bool]:
    chosen = {name: True for name in OPTIMIZATIONS}
    for key, item in (value or {}).items():
        if key not in OPTIMIZATIONS:
            raise JobConfigError(f"training_job: optimizations[{key!r}]: unknown; known: "
                                 f"{list(OPTIMIZATIONS)}")
        if not isinstance(item, bool):
            raise JobConfigError(f"training_job: optimizations[{key!r}] = {item!r}: must be "
                                 "True or False")
        chosen[key] = item
    return chosen


def _model_tag(model: str | Mapping[str, Any]) -> str:
    if isinstance(model, Mapping):
        return str(model.get("name", "custom"))
    return Path(model).stem if ("/" in model or model.endswith((".json", ".toml"))) else model


def _model_config(model: str | Mapping[str, Any]) -> str | dict[str, Any]:
    """A bundled name passes through; a path to a JSON model config is read now, so the
    job's files carry the full config (a worker may not see the DAG folder's paths)."""
    if isinstance(model, Mapping):
        return dict(model)
    if "/" in model or model.endswith(".json"):
        import json

        path = Path(model)
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise JobConfigError(f"training_job: model = {model!r}: cannot read a JSON "
                                 f"model config there: {exc}") from None
        if not isinstance(loaded, dict):
            raise JobConfigError(f"training_job: model = {model!r}: must hold a JSON object")
        return loaded
    return model


def training_job(
    dag_id: str,
    *,
    model: str | Mapping[str, Any],
    steps: int,
    tenant: str = "default",
    schedule: Any = None,
    start_date: datetime | None = None,
    checkpoint_interval: int | str = 50,
    retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=10),
    restarts: int = 1,
    nproc: int = 1,
    optimizations: Mapping[str, bool] | None = None,
    faults: Sequence[Mapping[str, Any]] = (),
    trainer_options: Mapping[str, Any] | None = None,
    queues: Mapping[str, str] | None = None,
    pools: Mapping[str, str] | None = None,
    work_dir: str | None = None,
    record: bool = True,
    tags: Sequence[str] = (),
    **dag_kwargs: Any,
) -> DAG:
    """Build a lifecycle DAG: `prewarm_compile_cache >> train >> publish_model`.

    :param model: a bundled model name (`dlrm_tiny`, `dlrm_small`, `dlrm_criteo_1m`), a
        path to a JSON model config, or the config as a mapping.
    :param steps: training steps (the trigger form can change it per run).
    :param tenant: the owning tenant (reports, and later scheduling priorities).
    :param checkpoint_interval: steps (int), seconds ("30s"), or "auto" (Young/Daly from
        this job's measured checkpoint cost and failure history).
    :param retries: Airflow retries of the train task, after the in-place restarts.
    :param retry_delay: delay before such a retry (a preemption retries at once).
    :param restarts: in-place trainer restarts per train try.
    :param nproc: trainer processes (torchrun when > 1).
    :param optimizations: switch any of `fast_batch`, `parallel_init`, `compile_cache`
        (also decides whether there is a prewarm task), `async_checkpoint`,
        `standalone_publish` (publish on CPU after the GPU task; off: inside it). All on
        by default.
    :param faults: injected failures, `[{kind: raise|kill|hang, at_step, attempt}]`
        (the trigger form's `inject_fault` overrides them per run).
    :param trainer_options: any other trainer config field (batch_size, seed,
        step_sleep_s, data_startup_latency_s, num_workers, grace_s, keep_last,
        hang_timeout_s (a watchdog: no step for that long -> restart), ...).
    :param queues: per role (`prewarm`, `train`, `publish`); default cpu / gpu / cpu.
    :param pools: per role; default Airflow's default pool.
    :param work_dir: job files, compile cache and models; default `[ett] work_dir`.
    :param record: False: no ETT recording for this DAG (the per-DAG opt-out).
    :param dag_kwargs: passed to `airflow.sdk.DAG` (description, catchup, ...).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise JobConfigError(f"training_job: steps = {steps!r}: must be an integer >= 1")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise JobConfigError(f"training_job: retries = {retries!r}: must be an integer >= 0")
    if not isinstance(retry_delay, timedelta) or retry_delay < timedelta(0):
        raise JobConfigError(f"training_job: retry_delay = {retry_delay!r}: must be a "
                             "timedelta >= 0")
    if not isinstance(tenant, str) or not tenant or len(tenant) > 80:
        raise JobConfigError(f"training_job: tenant = {tenant!r}: must be a non-empty string "
                             "of at most 80 characters")
    opts = _optimizations(optimizations)
    queue_of = {**DEFAULT_QUEUES, **_roles_mapping("queues", queues)}
    pool_of = _roles_mapping("pools", pools)
    options = dict(trainer_options or {})
    clashing = sorted(set(options) & {"model", "steps", "checkpoint_interval", "faults",
                                      "optimizations"})
    if clashing:
        raise JobConfigError(f"training_job: trainer_options {clashing} have their own "
                             "parameters")
    trainer_config: dict[str, Any] = {
        **options,
        "model": _model_config(model),
        "steps": steps,
        "checkpoint_interval": checkpoint_interval,
        "faults": [dict(f) for f in faults],
        "optimizations": {k: opts[k] for k in TRAINER_OPTIMIZATIONS},
    }
    check_trainer_config(trainer_config)

    first_fault = dict(faults[0]) if faults else {}
    params = {
        "steps": Param(steps, type="integer", minimum=1, description="training steps"),
        "inject_fault": Param(first_fault.get("kind", "none"), enum=list(FAULT_KINDS),
                              description="inject one failure into the trainer"),
        "fault_at_step": Param(int(first_fault.get("at_step", 1)), type="integer", minimum=1,
                               description="the step after which the failure happens"),
        "fault_attempt": Param(int(first_fault.get("attempt") or 1), type="integer",
                               minimum=1, description="the trainer attempt it happens on"),
    }
    common: dict[str, Any] = {"trainer_config": trainer_config, "nproc": nproc,
                              "work_dir": work_dir, "record": record}

    def role_kwargs(role: str) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": TASK_IDS[role], "queue": queue_of[role], **common}
        if role in pool_of:
            out["pool"] = pool_of[role]
        return out

    dag_tags = [*tags_for(tenant, _model_tag(model), record=record), *tags]
    with DAG(dag_id, schedule=schedule, start_date=start_date, params=params, tags=dag_tags,
             **dag_kwargs) as dag:
        train = TorchRecTrainOperator(
            restarts=restarts, publish_in_task=not opts["standalone_publish"],
            retries=retries, retry_delay=retry_delay, **role_kwargs("train"))
        if opts["compile_cache"] and trainer_config.get("compile", True):
            CompileCachePrewarmOperator(**role_kwargs("prewarm")) >> train
        if opts["standalone_publish"]:
            train >> PublishModelOperator(**role_kwargs("publish"))
    return dag
