"""`training_job(...)`: a whole lifecycle DAG from one call.

prewarm compile cache (CPU) -> train (GPU; in-place restarts, then retries) -> publish
(CPU). A model owner states the job; the factory chooses the tasks, queues, retry
policy and trigger-form params, and every option is checked when the DAG file is parsed
so that a typo fails in the DAG processor's import errors, not an hour into a run.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Required

from airflow.sdk import DAG, Param

from airflow_ett.jobs import tags_for
from airflow_ett.operators.job import (
    FAULT_KINDS,
    MAX_NPROC,
    MAX_RESTARTS,
    MAX_RETRIES,
    MAX_RETRY_DELAY_S,
    FaultEntry,
    JobConfigError,
    OwnerParts,
    Placement,
    TrainerOptions,
    TrainerSpec,
    check_trainer_config,
    check_work_dir,
    reader,
)
from airflow_ett.operators.prewarm import CompileCachePrewarmOperator
from airflow_ett.operators.publish import PublishModelOperator, model_asset
from airflow_ett.operators.train import TorchRecTrainOperator
from airflow_ett.trainer.config import MAX_ATTEMPT, MAX_STEPS, TrainerConfig
from airflow_ett.trainer.model_spec import ModelSpecError, read_model_spec
from airflow_ett.trainer.schema import read_data_spec

if TYPE_CHECKING:
    from airflow.sdk.definitions.dag import ScheduleArg

TRAINER_OPTIMIZATIONS: Final = ("fast_batch", "parallel_init", "compile_cache",
                                "async_checkpoint", "warm_standby")
OPTIMIZATIONS: Final = (*TRAINER_OPTIMIZATIONS, "standalone_publish")
ROLES: Final = ("prewarm", "train", "publish")
TASK_IDS: Final = {"prewarm": "prewarm_compile_cache", "train": "train",
                   "publish": "publish_model"}
DEFAULT_QUEUES: Final = {"prewarm": "cpu", "train": "gpu", "publish": "cpu"}


_R = reader("training_job")


class RoleArgs(Placement, total=False):
    """What a lifecycle task of `role` is built with, besides its own parameters."""

    task_id: Required[str]
    doc_md: str
    trainer_config: TrainerSpec
    nproc: int
    work_dir: str | None
    record: bool


def _roles_mapping(name: str, value: object) -> dict[str, str]:
    """`{role: name}`; a list or a string is refused by name (`dict(["gpu"])` would say
    "dictionary update sequence element #0 has length 3")."""
    if value is None:
        return {}
    given = _R.mapping(name, value)
    unknown = sorted(set(given) - set(ROLES))
    if unknown:
        raise JobConfigError(f"training_job: {name} has unknown key(s) {unknown}; known: "
                             f"{list(ROLES)}")
    return {key: _R.text(f"{name}[{key!r}]", item) for key, item in given.items()}


def _our_trainer(model: str | Mapping[str, object] | None, steps: int | None,
                 checkpoint_interval: int | str | None
                 ) -> tuple[str | Mapping[str, object], int, int | str]:
    """A job of our trainer needs its model and steps; the interval defaults to 50."""
    if model is None or steps is None:
        raise JobConfigError("training_job: needs model= and steps= (our trainer on your "
                             "model), or command= (your own trainer)")
    return model, steps, 50 if checkpoint_interval is None else checkpoint_interval


def _check_retry_delay(retry_delay: object) -> timedelta:
    if not isinstance(retry_delay, timedelta) or not (
            timedelta(0) <= retry_delay <= timedelta(seconds=MAX_RETRY_DELAY_S)):
        raise _R.fail("retry_delay", retry_delay,
                      f"must be a timedelta >= 0 and <= {MAX_RETRY_DELAY_S:.0f} s")
    return retry_delay


def _optimizations(value: object) -> dict[str, bool]:
    chosen = {name: True for name in OPTIMIZATIONS}
    if value is None:
        return chosen
    for key, item in _R.mapping("optimizations", value).items():
        if key not in OPTIMIZATIONS:
            raise JobConfigError(f"training_job: optimizations[{key!r}]: unknown; known: "
                                 f"{list(OPTIMIZATIONS)}")
        chosen[key] = _R.boolean(f"optimizations[{key!r}]", item)
    return chosen


def _faults(value: Sequence[FaultEntry]) -> list[FaultEntry]:
    """A list of `{kind, at_step, attempt}` mappings (the trainer reads each field)."""
    _R.sequence("faults", value)
    for i, item in enumerate(value):
        _R.mapping(f"faults[{i}]", item)
    return [FaultEntry(**item) for item in value]


def _model_tag(model: str | Mapping[str, object]) -> str:
    if isinstance(model, Mapping):
        return str(model.get("name", "custom"))
    if ":" in model:  # an owner's factory: its module's name
        return model.split(":", 1)[0].rsplit(".", 1)[-1]
    return Path(model).stem if ("/" in model or model.endswith((".json", ".toml"))) else model


def _caller_dir() -> Path:
    """The folder of the DAG file that called `training_job` (two frames up): where an
    owner's model package and relative data paths are looked for, as they are written
    beside the DAG."""
    frame = sys._getframe(2)
    return Path(frame.f_code.co_filename).resolve().parent


def _owner_parts(model: str | Mapping[str, object], model_config: object, data: object,
                 here: Path) -> OwnerParts:
    """The trainer config's `model_config`, `model_code_path` and `data` for an owner's
    model or data, resolved now: the module found (not imported) from the DAG's folder,
    relative data paths made absolute, everything checked (one line each)."""
    out: OwnerParts = {}
    if isinstance(model, str) and ":" in model:
        try:
            spec = read_model_spec(model, model_config, where="training_job", search=[here])
        except ModelSpecError as exc:
            raise JobConfigError(str(exc)) from None
        out["model_config"] = dict(spec.config)
        if spec.code_path is not None:
            out["model_code_path"] = str(spec.code_path)
    elif model_config is not None:
        raise _R.fail("model_config", model_config, "is for a model given by import path "
                                                    "('pkg.module:build')")
    if data is not None:
        out["data"] = read_data_spec(data, base=here, where="training_job",
                                     error=JobConfigError).to_dict()
    return out


def _model_config(model: str | Mapping[str, object]) -> str | dict[str, object]:
    """A bundled name passes through; a path to a JSON model config is read now, so the
    job's files carry the full config (a worker may not see the DAG folder's paths)."""
    if isinstance(model, Mapping):
        return dict(model)
    if "/" in model or model.endswith(".json"):
        from airflow_ett._untrusted import UntrustedFileError, load_json

        try:  # at parse time, in the DAG processor: a FIFO or /dev/zero must not hang it
            loaded = load_json(Path(model), what="model config", max_bytes=1 << 20)
        except UntrustedFileError as exc:
            raise JobConfigError(f"training_job: model = {model!r}: cannot read a JSON "
                                 f"model config there: {exc.reason}") from None
        if not isinstance(loaded, dict):
            raise JobConfigError(f"training_job: model = {model!r}: must hold a JSON object")
        return loaded
    return model


TASK_DOCS: Final = {
    "prewarm": "Compiles the model once on CPU and saves the compile cache, so that the train "
               "task's compile (and every recovery's) loads it instead of compiling again. "
               "Its time is counted as compilation.",
    "train": "Runs the trainer on the GPU queue: restores the newest checkpoint, trains, "
             "checkpoints asynchronously, restarts in place on a failure (then Airflow "
             "retries). Its end is when the job releases its GPUs: E2E stops there.",
    "publish": "Publishes the trained model from the last checkpoint on CPU, after the GPUs "
               "were released; reported as time to model available, not as GPU time.",
}


def _dag_doc(tenant: str, model: str, steps: int, opts: Mapping[str, bool],
             record: bool) -> str:
    """The DAG page's documentation: what the job is, its tasks, the trigger form."""
    on = ", ".join(k for k, v in opts.items() if v) or "none"
    recorded = ("Every phase is recorded for ETT%: see the run's **ETT breakdown** view."
                if record else "ETT recording is off for this DAG (`record=False`).")
    return f"""\
### Training job `{model}` (tenant `{tenant}`)

A lifecycle built by `airflow_ett.operators.training_job`: prewarm the compile cache on CPU,
train on the GPU queue, publish the model on CPU after the GPUs are released. {recorded}

| task | what it does |
|---|---|
| `prewarm_compile_cache` | {TASK_DOCS["prewarm"]} |
| `train` | {TASK_DOCS["train"]} |
| `publish_model` | {TASK_DOCS["publish"]} |

Optimizations on: {on}.

**Trigger form** (all optional): `steps` (default {steps}) training steps; `inject_fault`
(`none`, `raise`, `kill`, `hang`) one failure injected into the trainer, after step
`fault_at_step` of attempt `fault_attempt`, to watch recovery and its TTR.
"""


def _form_params(steps: int, cfg: TrainerConfig, trainer_config: TrainerSpec
                 ) -> dict[str, Param]:
    """The trigger form: steps, one injected fault, and an owner job's data paths and
    model config."""
    first_fault = cfg.faults[0] if cfg.faults else None  # validated: no int() truncation
    params = {
        "steps": Param(steps, type="integer", minimum=1, maximum=MAX_STEPS,
                       description="training steps"),
        "inject_fault": Param(first_fault.kind if first_fault else "none",
                              enum=list(FAULT_KINDS),
                              description="inject one failure into the trainer"),
        "fault_at_step": Param(first_fault.at_step if first_fault else 1, type="integer",
                               minimum=1, maximum=MAX_STEPS,
                               description="the step after which the failure happens"),
        "fault_attempt": Param((first_fault.attempt or 1) if first_fault else 1,
                               type="integer", minimum=1, maximum=MAX_ATTEMPT,
                               description="the trainer attempt it happens on"),
    }
    if "data" in trainer_config:
        params["data_paths"] = Param(trainer_config["data"]["paths"], type="array",
                                     items={"type": "string"}, minItems=1,
                                     description="the data's files: absolute paths or globs")
    if "model_config" in trainer_config:
        params["model_config"] = Param(trainer_config["model_config"], type="object",
                                       description="the table passed to the model's factory")
    return params


def training_job(
    dag_id: str,
    *,
    model: str | Mapping[str, object] | None = None,
    steps: int | None = None,
    command: Sequence[str] | None = None,
    grace_s: float = 30.0,
    progress_pattern: str | None = None,
    env: Mapping[str, str] | None = None,
    model_config: Mapping[str, object] | None = None,
    data: Mapping[str, object] | None = None,
    tenant: str = "default",
    schedule: ScheduleArg = None,
    start_date: datetime | None = None,
    checkpoint_interval: int | str | None = None,
    retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=10),
    restarts: int = 1,
    nproc: int = 1,
    optimizations: Mapping[str, bool] | None = None,
    faults: Sequence[FaultEntry] | None = None,
    trainer_options: TrainerOptions | None = None,
    queues: Mapping[str, str] | None = None,
    pools: Mapping[str, str] | None = None,
    work_dir: str | None = None,
    record: bool = True,
    tags: Sequence[str] = (),
    **dag_kwargs: Any,
) -> DAG:
    """Build a lifecycle DAG: `prewarm_compile_cache >> train >> publish_model` for our
    trainer on your model; or, given a `command`, the train task around your trainer.

    :param model: your model's factory as an import path (`"ranking.towers:build"`, the
        module found beside this DAG file or installed; the contract:
        docs/model-contract.md), a bundled DLRM's name (`dlrm_tiny`, `dlrm_small`,
        `dlrm_criteo_1m`), a path to a JSON DLRM config, or that config as a mapping.
    :param steps: training steps (the trigger form can change it per run).
    :param command: your own trainer, as a command line (templated; a list of strings):
        the DAG is the train task alone, which runs it with restarts, preemption and
        recording (docs/trainer-protocol.md), in this DAG file's folder (relative paths
        in it are beside the DAG); `model` is then only the name reports use,
        and our trainer's parameters (steps, data, faults, ...) are refused.
    :param grace_s: a command job's grace after SIGTERM (`ETT_GRACE_S`).
    :param progress_pattern: a command job's step lines, as a regular expression with a
        named group `step` (optionally `cursor`, `loss`): Level 1 from its log.
    :param env: more environment for a command job's trainer (templated).
    :param model_config: the table passed to your factory (`ModelContext.config`); the
        trigger form's `model_config` can replace it per run.
    :param data: your files: `{format: criteo_tsv | criteo_npy | parquet, paths: glob or
        list (relative ones beside this DAG file), schema: {label, dense, sparse},
        max_bad_rows}` (docs/model-contract.md); the trigger form's `data_paths` can
        replace the paths per run. Default for a bundled DLRM: its generated log.
    :param tenant: the owning tenant (reports, and later scheduling priorities).
    :param checkpoint_interval: steps (int), seconds ("30s"), or "auto" (Young/Daly from
        this job's measured checkpoint cost and failure history).
    :param retries: Airflow retries of the train task, after the in-place restarts.
    :param retry_delay: delay before such a retry (a preemption retries at once).
    :param restarts: in-place trainer restarts per train try.
    :param nproc: trainer processes (torchrun when > 1).
    :param optimizations: switch any of `fast_batch`, `parallel_init`, `compile_cache`
        (also decides whether there is a prewarm task), `async_checkpoint`,
        `warm_standby` (in-place restarts hand over to a spare trainer process warmed up
        beside the running one; it holds a second copy of the model),
        `standalone_publish` (publish on CPU after the GPU task; off: inside it). All on
        by default.
    :param faults: injected failures, `[{kind: raise|kill|hang|sigterm|slow_save, at_step,
        attempt}]` (a `slow_save` may say `seconds`)
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
    _R.text("dag_id", dag_id)
    here = _caller_dir()
    if command is not None:
        from airflow_ett.operators.command_job import command_job

        return command_job(
            dag_id, command=command,
            model=model, tenant=_R.text("tenant", tenant, max_len=80),
            schedule=schedule, start_date=start_date,
            retries=_R.integer("retries", retries, minimum=0, maximum=MAX_RETRIES),
            retry_delay=_check_retry_delay(retry_delay),
            restarts=_R.integer("restarts", restarts, minimum=0, maximum=MAX_RESTARTS),
            nproc=_R.integer("nproc", nproc, minimum=1, maximum=MAX_NPROC),
            queues=_roles_mapping("queues", queues), pools=_roles_mapping("pools", pools),
            work_dir=check_work_dir("training_job", work_dir),
            record=_R.boolean("record", record), tags=list(_R.strings("tags", tags)),
            grace_s=grace_s, progress_pattern=progress_pattern, env=env, cwd=str(here),
            ours={"steps": steps, "model_config": model_config, "data": data,
                  "checkpoint_interval": checkpoint_interval, "optimizations": optimizations,
                  "faults": faults, "trainer_options": trainer_options},
            **dag_kwargs)
    model, steps, checkpoint_interval = _our_trainer(model, steps, checkpoint_interval)
    if not isinstance(model, str | Mapping) or (isinstance(model, str) and not model.strip()):
        raise _R.fail("model", model, "must be a bundled model's name, a path to a JSON model "
                                      "config, or the config as a mapping")
    steps = _R.integer("steps", steps, minimum=1, maximum=MAX_STEPS)
    retries = _R.integer("retries", retries, minimum=0, maximum=MAX_RETRIES)
    retry_delay = _check_retry_delay(retry_delay)
    restarts = _R.integer("restarts", restarts, minimum=0, maximum=MAX_RESTARTS)
    nproc = _R.integer("nproc", nproc, minimum=1, maximum=MAX_NPROC)
    _R.text("tenant", tenant, max_len=80)
    if start_date is not None and not isinstance(start_date, datetime):
        raise _R.fail("start_date", start_date, "must be a datetime or None")
    record = _R.boolean("record", record)
    dag_tags_own = list(_R.strings("tags", tags))
    work_dir = check_work_dir("training_job", work_dir)
    opts = _optimizations(optimizations)
    queue_of = {**DEFAULT_QUEUES, **_roles_mapping("queues", queues)}
    pool_of = _roles_mapping("pools", pools)
    fault_list = _faults(faults or ())
    options = TrainerOptions()
    if trainer_options is not None:
        _R.mapping("trainer_options", trainer_options)
        options = TrainerOptions(**trainer_options)
    clashing = sorted(set(options) & {"model", "steps", "checkpoint_interval", "faults",
                                      "optimizations", "model_config", "model_code_path",
                                      "data"})
    if clashing:
        raise JobConfigError(f"training_job: trainer_options {clashing} have their own "
                             "parameters")
    trainer_config: TrainerSpec = {
        **options,
        "model": _model_config(model),
        **_owner_parts(model, model_config, data, here),
        "steps": steps,
        "checkpoint_interval": checkpoint_interval,
        "faults": fault_list,
        "optimizations": {k: opts[k] for k in TRAINER_OPTIMIZATIONS},
    }
    cfg = check_trainer_config(trainer_config, nproc=nproc)

    params = _form_params(steps, cfg, trainer_config)

    def role_kwargs(role: str) -> RoleArgs:
        out: RoleArgs = {"task_id": TASK_IDS[role], "queue": queue_of[role],
                         "doc_md": TASK_DOCS[role], "trainer_config": trainer_config,
                         "nproc": nproc, "work_dir": work_dir, "record": record}
        if role in pool_of:
            out["pool"] = pool_of[role]
        return out

    dag_tags = [*tags_for(tenant, _model_tag(model), record=record, gpus=nproc),
                *dag_tags_own]
    dag_kwargs.setdefault("doc_md", _dag_doc(tenant, _model_tag(model), steps, opts, record))
    with DAG(dag_id, schedule=schedule, start_date=start_date, params=params, tags=dag_tags,
             **dag_kwargs) as dag:
        announced = [model_asset(dag_id)]  # the publishing task updates the model asset
        train = TorchRecTrainOperator(
            restarts=restarts, publish_in_task=not opts["standalone_publish"],
            retries=retries, retry_delay=retry_delay, **role_kwargs("train"),
            outlets=[] if opts["standalone_publish"] else announced)
        if opts["compile_cache"] and cfg.compile:
            CompileCachePrewarmOperator(**role_kwargs("prewarm")) >> train
        if opts["standalone_publish"]:
            train >> PublishModelOperator(**role_kwargs("publish"), outlets=announced)
    return dag
