"""A lifecycle job's trainer config and files: one definition for all three tasks.

The prewarm, train and publish tasks run in different processes (and, on a fleet, on
different workers), yet must agree on the trainer config, the checkpoint directory and
the compile cache. So each task derives them the same way from the same inputs: the
config declared in the DAG file, the DAG run's params (the trigger form), and
`[ett] work_dir`. Nothing here imports Airflow or torch: DAG files call it at parse time.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypedDict

from airflow_ett._fs import atomic_write
from airflow_ett.trainer.config import (
    MAX_ATTEMPT,
    MAX_STEPS,
    ConfigError,
    TrainerConfig,
    check_fault_ranks,
    config_from_mapping,
    trainer_file_bytes,
)

# The trainer config, as the operators hold and write it: the trainer's own file format
# (`trainer.config`), which the trainer reads field by field (`config_from_mapping`).
from airflow_ett.trainer.config import FaultEntry as FaultEntry
from airflow_ett.trainer.config import OwnerParts as OwnerParts
from airflow_ett.trainer.config import TrainerFile as TrainerFile
from airflow_ett.trainer.config import TrainerOptions as TrainerOptions
from airflow_ett.trainer.config import TrainerSpec as TrainerSpec
from airflow_ett.trainer.faults import FAULT_KINDS as TRAINER_FAULT_KINDS
from airflow_ett.trainer.preflight import (
    check_cursor_range,
    check_parse_time_memory,
    shapes_of,
)
from airflow_ett.trainer.readers import Reader

# Fields the operators own: a DAG file that sets them would fight the job's layout.
MANAGED_FIELDS: Final = ("checkpoint_dir", "compile_cache_dir", "events_file")
# The plausible range of the operators' own numbers (docs/decisions/0023); the trainer
# config's are in `airflow_ett.trainer.config`.
#: Trainer processes on one host (torchrun's --nproc-per-node): hosts have at most a few
#: hundred cores, and 8 to 16 accelerators.
MAX_NPROC: Final = 1024
#: In-place restarts per try, and Airflow retries: each repeats the job's whole start;
#: past a hundred the job is failing, not recovering.
MAX_RESTARTS: Final = 100
MAX_RETRIES: Final = 100
#: Airflow's own longest retry delay defaults to a day (`[core] max_task_retry_delay`).
MAX_RETRY_DELAY_S: Final = 86_400.0
#: One attempt's wall-clock bound: training attempts run hours to weeks; 30 days.
MAX_ATTEMPT_TIMEOUT_S: Final = 30 * 86_400.0
FAULT_KINDS: Final = ("none", *TRAINER_FAULT_KINDS)  # what the trigger form offers
PARAM_NAMES: Final = ("steps", "inject_fault", "fault_at_step", "fault_attempt",
                       "data_paths", "model_config")


class JobConfigError(ValueError):
    """A lifecycle job that cannot run; the message names the parameter and value."""


class Placement(TypedDict, total=False):
    """Where a task of the job runs: its queue, and its pool when the DAG names one (left
    out, the pool is the task's default, or the DAG's `default_args`')."""

    queue: str
    pool: str


@dataclass(frozen=True, slots=True)
class JobPaths:
    work_dir: Path
    job_dir: Path
    config_file: Path
    checkpoint_dir: Path
    compile_cache_dir: Path
    models_dir: Path


def _safe(name: str) -> str:
    """A run id as a directory name: readable, and unique even where two ids differ only
    in characters a path cannot hold (`:` and `+` in Airflow's timestamps)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"
    return f"{readable[:80]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def job_paths(work_dir: Path, dag_id: str, run_id: str) -> JobPaths:
    job_dir = work_dir / "jobs" / _safe(dag_id) / _safe(run_id)
    return JobPaths(
        work_dir=work_dir,
        job_dir=job_dir,
        config_file=job_dir / "trainer.json",
        checkpoint_dir=job_dir / "checkpoints",
        # shared by every job of the work dir: entries are keyed by model, device, shapes
        compile_cache_dir=work_dir / "compile_cache",
        models_dir=work_dir / "models",
    )


def reader(where: str) -> Reader:
    """The typed readers (`airflow_ett.trainer.readers`) for a lifecycle entry point:
    the same rules as the trainer's config, raising `JobConfigError`."""
    return Reader(where, JobConfigError)


def check_trainer_config(config: Mapping[str, object], *, nproc: int = 1) -> TrainerConfig:
    """Validate a DAG file's trainer config as the trainer will (at DAG parse time),
    including whether its tables and batches can fit in memory at all (pure arithmetic
    against `PARSE_TIME_MEMORY_CAP_BYTES`; the trainer checks the real memory at start)."""
    reader("trainer_config").mapping("trainer_config", config)
    managed = sorted(set(config) & set(MANAGED_FIELDS))
    if managed:
        raise JobConfigError(f"trainer config: {managed} are set by the lifecycle "
                             f"operators (under [ett] work_dir); remove them")
    try:
        cfg = config_from_mapping({**config, "checkpoint_dir": "/nonexistent/validate"})
        check_fault_ranks(cfg.faults, nproc)  # a fault aimed at rank 3 of 2: at parse time
        check_cursor_range(cfg.steps, cfg.batch_size, nproc,
                           Reader("trainer config", ConfigError))
        check_parse_time_memory(shapes_of(cfg), cfg.batch_size, prefetch=cfg.prefetch,
                                num_workers=cfg.num_workers, nproc=nproc,
                                reader=Reader("trainer config", ConfigError))
    except ConfigError as exc:
        raise JobConfigError(str(exc)) from None
    return cfg


def check_work_dir(where: str, work_dir: object) -> str | None:
    """None (`[ett] work_dir`) or a path; one that exists here as a file is refused now.
    (Writability is checked where the task runs: this host may not be the worker.)"""
    if work_dir is None:
        return None
    path = reader(where).path("work_dir", work_dir)
    if path.exists() and not path.is_dir():
        raise reader(where).fail("work_dir", str(path), "exists and is not a directory")
    return str(path)


def check_train_args(where: str, *, restarts: object, publish_in_task: object,
                     attempt_timeout_s: object) -> tuple[int, bool, float | None]:
    """The train operator's own arguments, read like every other field."""
    r = reader(where)
    return (r.integer("restarts", restarts, minimum=0, maximum=MAX_RESTARTS),
            r.boolean("publish_in_task", publish_in_task),
            None if attempt_timeout_s is None
            else r.number("attempt_timeout_s", attempt_timeout_s, above=0,
                          maximum=MAX_ATTEMPT_TIMEOUT_S))


def _int_param(params: Mapping[str, object], name: str, minimum: int, maximum: int) -> int:
    """A trigger-form integer. The form (or `airflow dags trigger -c`) may send the
    digits as a string: those are read exactly; anything else that is not an int
    (a float, a bool, '12.5') is refused, never truncated."""
    value = params[name]
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 30:
        value = int(value)
    return reader("").integer(f"DAG param {name!r}", value, minimum=minimum, maximum=maximum)


def apply_params(config: TrainerSpec, params: Mapping[str, object] | None) -> TrainerSpec:
    """The trainer config with the trigger form's values applied.

    `steps` replaces the step count; `inject_fault` ("none" or a fault kind) with
    `fault_at_step` and `fault_attempt` replaces the configured faults; `data_paths`
    (absolute paths or globs) replaces the data's files and `model_config` the owner
    model's config table, for a job that has them. Other params are the DAG author's own
    and are left alone.
    """
    out = TrainerSpec(**config)
    params = reader("").mapping("DAG params", params or {})
    _apply_owner_params(config, params, out)
    if params.get("steps") is not None:
        out["steps"] = _int_param(params, "steps", 1, MAX_STEPS)
    if params.get("inject_fault") is not None:
        kind = reader("").text("DAG param 'inject_fault'", params["inject_fault"],
                               choices=FAULT_KINDS)
        if kind == "none":
            wanted: list[FaultEntry] = []
        else:
            at_step = _int_param(params, "fault_at_step", 1, MAX_STEPS) if params.get(
                "fault_at_step") is not None else 1
            attempt = _int_param(params, "fault_attempt", 1, MAX_ATTEMPT) if params.get(
                "fault_attempt") is not None else 1
            wanted = [{"kind": kind, "at_step": at_step, "attempt": attempt}]
        # The form shows the first configured fault as its default: submitted unchanged,
        # it asks for the DAG's faults as configured, all of them, not that one alone.
        if _form_fault(config.get("faults")) != _form_fault(wanted):
            out["faults"] = wanted
    return out


def _apply_owner_params(config: TrainerSpec, params: Mapping[str, object],
                        out: TrainerSpec) -> None:
    """`data_paths` and `model_config` from the form, into `out` (checked as the trainer
    will read them when the job's config is materialized)."""
    r = reader("")
    data = config.get("data")
    paths = params.get("data_paths")
    if paths is not None and isinstance(data, Mapping):
        chosen = list(r.strings("DAG param 'data_paths'", paths))
        for i, path in enumerate(chosen):
            if not Path(path).is_absolute():
                raise r.fail(f"DAG param 'data_paths'[{i}]", path, "must be an absolute path "
                                                                   "or glob (the worker's)")
        before = data.get("paths", [])
        if chosen and chosen != (list(before) if isinstance(before, Iterable) else before):
            out["data"] = {**data, "paths": chosen}
    model_config = params.get("model_config")
    if model_config is not None and "model_config" in config:
        out["model_config"] = dict(r.mapping("DAG param 'model_config'", model_config))


def _form_fault(faults: object) -> tuple[object, ...]:
    """What the trigger form shows of a fault list: its first fault's kind, step and
    attempt ("none" for no fault)."""
    if not isinstance(faults, list | tuple) or not faults:
        return ("none",)
    first = faults[0]
    if not isinstance(first, Mapping):
        return ("?",)
    return (first.get("kind"), first.get("at_step"), first.get("attempt") or 1)


def materialize(config: TrainerSpec, params: Mapping[str, object] | None,
                paths: JobPaths) -> TrainerConfig:
    """Write the job's trainer config file (atomically) and return it parsed.

    Every task writes the same bytes from the same inputs, so whichever runs first, the
    trainer, the publisher and a retry read one config.
    """
    data: TrainerFile = {
        **apply_params(config, params),
        "checkpoint_dir": str(paths.checkpoint_dir),
        "compile_cache_dir": str(paths.compile_cache_dir),
    }
    try:
        parsed = config_from_mapping(data)
    except ConfigError as exc:
        raise JobConfigError(str(exc)) from None
    try:
        paths.job_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(paths.config_file, trainer_file_bytes(data), mode=0o600)
    except (PermissionError, NotADirectoryError, FileExistsError) as exc:
        # a setup mistake, not a passing fault: retrying cannot fix it
        raise JobConfigError(f"work_dir = {str(paths.work_dir)!r}: cannot write the job's "
                             f"files under it ({paths.job_dir}): {exc.strerror or exc}"
                             ) from None
    return parsed
