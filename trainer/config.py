"""The trainer's configuration: one file (TOML or JSON), validated before any work starts.

Every optimization has its own switch under `[optimizations]` so that the baseline and
the optimized job can be measured side by side with one setting changed. Bad values fail
at load with the field and value named: a job that would crash after ten minutes of
startup on a typo is exactly the waste this project exists to remove.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Final, Required, TypedDict

from airflow_ett._untrusted import UntrustedFileError, load_json, load_toml
from airflow_ett.ett.events import MAX_WORLD_SIZE
from airflow_ett.trainer.faults import FAULT_KINDS, SLOW_SAVE_S
from airflow_ett.trainer.faults import FaultSpec as FaultSpec  # a config's `faults`
from airflow_ett.trainer.model_config import ModelConfig, ModelConfigError, resolve_model_config
from airflow_ett.trainer.model_spec import (
    DLRM_FACTORY,
    ModelSpec,
    ModelSpecError,
    code_identity,
    read_model_spec,
)
from airflow_ett.trainer.readers import Reader, show
from airflow_ett.trainer.schema import (
    DataSpec,
    DataSpecError,
    SchemaTable,
    read_data_spec,
    synthetic,
)


class ConfigError(ValueError):
    """A trainer config that cannot run; the message names the field and value."""


# The plausible range of every number of the config (docs/decisions/0023): generous, so
# that any real job fits, and tight enough that a typo or a unit mistake (milliseconds
# for seconds) is refused at load instead of crashing or hanging the job later.
DAY_S = 86_400.0
#: Steps of one job: at a millisecond a step, 11 days; real jobs run 1e4 to 1e7.
MAX_STEPS = 10**9
#: Examples per process per step: DLRM's largest published global batches are 64k-256k.
MAX_BATCH_SIZE = 2**20
#: Learning rates: past 100, SGD and Adagrad diverge on the first step.
MAX_LR = 100.0
#: Data worker processes per trainer process: each is a process of its own (about 17 MB
#: before any batch; the preflight counts them against memory) and a host has at most a
#: few hundred cores.
MAX_NUM_WORKERS = 256
#: Batches queued ahead of the step.
MAX_PREFETCH = 1024
#: `data_startup_latency_s` stands in for a real pipeline's connection to its storage
#: (benchmarks); `step_sleep_s` pads each step (demos): an hour of either is no demo.
MAX_SLEEP_S = 3600.0
#: Checkpoints kept.
MAX_KEEP_LAST = 1000
#: Durations of the job's own clock: the grace to checkpoint and leave (as the tenants
#: file's `grace_s`), a log line's period, the hang watchdog, a checkpoint interval in
#: seconds, a `slow_save`'s extra time: a day at most (past it a deadline never comes
#: while anyone watches, and 1e308 overflows every timer it reaches).
MAX_DURATION_S = DAY_S
#: A fault's `attempt`: an attempt number no retry policy reaches.
MAX_ATTEMPT = 10_000
#: A fault's `rank` is below the most processes a job may report (events'
#: `MAX_WORLD_SIZE`) and below this job's world size (`check_fault_ranks`).


def check_fault_ranks(faults: tuple[FaultSpec, ...], world_size: int) -> None:
    """Every fault's `rank` names a rank of this job; `ConfigError` naming the first that
    does not (a fault aimed at rank 3 of a 2-rank job would silently never fire)."""
    for i, spec in enumerate(faults):
        if spec.rank is not None and spec.rank >= world_size:
            raise _bad(f"faults[{i}].rank", spec.rank,
                       f"must be below the job's world size ({world_size})")


# -- the file, as its writers hold it -----------------------------------------------------
# A trainer config is a TOML or JSON table: a person's own (`--config`), or `<job>/
# trainer.json`, which the lifecycle operators write (`operators.job.materialize`, its one
# writer; `load_config` its one reader). These say which fields there are and what goes
# in them; the reader still checks every value (`config_from_mapping`): the file is
# input. Tables the config only hands on (a DLRM's config, an owner's `model_config`, the
# `data` table, read by `schema.read_data_spec`) stay mappings.


class FaultEntry(TypedDict, total=False):
    """One injected failure of `faults` (`faults.FaultSpec`, read field by field)."""

    kind: Required[str]
    at_step: Required[int]
    attempt: int | None
    seconds: float  # a `slow_save`'s extra time, or a `slow_steps`' per step
    rank: int | None


class TrainerOptions(TypedDict, total=False):
    """The config's plain fields: `training_job(trainer_options=...)`, every field but
    the ones the factory has a parameter for (or the operators manage)."""

    seed: int
    batch_size: int
    lr_dense: float
    lr_sparse: float
    num_workers: int
    prefetch: int
    data_startup_latency_s: float
    compile: bool
    keep_last: int
    grace_s: float
    log_every_s: float
    step_sleep_s: float
    hang_timeout_s: float | None
    rank_report_s: float | None


class OwnerParts(TypedDict, total=False):
    """An owner's model and data (docs/model-contract.md): the table passed to the
    factory, the folder its code was found in, the `data` table."""

    model_config: Mapping[str, object]
    model_code_path: str
    data: Mapping[str, object]


class TrainerSpec(TrainerOptions, OwnerParts, total=False):
    """A job's trainer config as a DAG declares it (`trainer_config=` of the operators):
    every field but the paths the operators manage (`operators.job.MANAGED_FIELDS`)."""

    model: Required[str | Mapping[str, object]]  # a bundled name, a DLRM table, "pkg.mod:fn"
    steps: Required[int]
    checkpoint_interval: int | str  # steps, seconds ("30s") or "auto"
    faults: list[FaultEntry]
    optimizations: Mapping[str, bool]


class TrainerFile(TrainerSpec, total=False):
    """`<job>/trainer.json`, what crosses from the operators to the trainer process: the
    run's `TrainerSpec` (the trigger form applied) with the job's paths. One writer
    (`operators.job.materialize`, through `trainer_file_bytes`: every task of the job the
    same bytes), one reader (`load_config`, `--config`)."""

    checkpoint_dir: Required[str]
    compile_cache_dir: str


class ConfigTable(TrainerFile, total=False):
    """Every field a trainer config may hold: `TrainerFile`'s, and `events_file`, which a
    config of a person's own may set (the operators never write it: events go to the
    store)."""

    events_file: str


#: The fields a config must give, in the order a missing one is named. (Declared here:
#: `Required[...]` is invisible at runtime under postponed annotations.)
REQUIRED_FIELDS: Final = ("model", "steps", "checkpoint_dir")


def trainer_file_bytes(table: TrainerFile) -> bytes:
    """`<job>/trainer.json` as its one writer writes it: the same table, the same bytes
    (sorted keys), so that whichever task writes first, every reader reads one config."""
    return (json.dumps(table, indent=2, sort_keys=True) + "\n").encode("utf-8")


@dataclass(frozen=True, slots=True)
class Optimizations:
    fast_batch: bool = True  # compile on a synthetic batch while the data pipeline starts
    parallel_init: bool = True  # pipeline, model, restore and compile overlap
    compile_cache: bool = True  # restore/save the compile cache around torch.compile
    async_checkpoint: bool = True  # stage, then write in the background
    # the launcher keeps the next attempt's process warm (trainer/standby.py); a restart
    # hands over to it instead of starting cold. Off for a model that does not fit twice.
    warm_standby: bool = True


class CacheIdentity(TypedDict):
    """The model part of a compile-cache key (`TrainerConfig.cache_identity`)."""

    name: str
    factory: str
    code: str
    config: dict[str, object]
    schema: SchemaTable


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    model: ModelSpec
    steps: int
    checkpoint_dir: Path
    seed: int = 1234
    batch_size: int = 256
    lr_dense: float = 0.05
    lr_sparse: float = 0.05
    num_workers: int = 1
    prefetch: int = 4
    data_startup_latency_s: float = 0.0
    compile: bool = True
    compile_cache_dir: Path | None = None
    checkpoint_interval: int | float | str = 50  # steps (int), seconds ("30s"), or "auto"
    keep_last: int = 3
    grace_s: float = 30.0
    log_every_s: float = 5.0
    step_sleep_s: float = 0.0  # pad each step (demos of long jobs on a fast CPU model)
    hang_timeout_s: float | None = None  # no step for this long: exit 70 (see watchdog.py)
    # each rank's own step time, reported about this often (rank_steps.py); None: not
    # measured (no probe). A job of one process has no other rank to wait for.
    rank_report_s: float | None = 10.0
    events_file: Path | None = None  # write events here instead of the ETT store
    faults: tuple[FaultSpec, ...] = ()
    optimizations: Optimizations = field(default_factory=Optimizations)
    data: DataSpec = field(default_factory=lambda: _bundled_data(BUNDLED_DEFAULT))

    # -- derived ---------------------------------------------------------------------
    @property
    def model_identity(self) -> str:
        """What this job's checkpoints and compile-cache entries are tied to: the
        factory, its code, its config and the data schema (`ModelSpec.identity`)."""
        return self.model.identity(self.data.schema.fingerprint())

    def cache_identity(self) -> CacheIdentity:
        """The model part of the compile-cache key: everything of the identity, readable
        in the key's inputs (no path: two folders holding the same code share entries)."""
        return {"name": self.model.name, "factory": self.model.factory,
                "code": self.model.code, "config": dict(self.model.config),
                "schema": self.data.schema.to_dict()}

    def interval_steps(self) -> int | None:
        value = self.checkpoint_interval
        return value if isinstance(value, int) else None

    def interval_seconds(self) -> float | None:
        value = self.checkpoint_interval
        if isinstance(value, str) and value.endswith("s") and value != "auto":
            return float(value[:-1])
        return None


_R = Reader("trainer config", ConfigError)
_INTERVAL_WHY = "give steps (int), seconds ('30s') or 'auto'"


def _bad(name: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"trainer config: {name} = {show(value)}: {why}")


def _interval(value: object) -> int | str:
    if isinstance(value, bool):
        raise _bad("checkpoint_interval", value, _INTERVAL_WHY)
    if isinstance(value, int):
        if not 0 < value <= MAX_STEPS:
            raise _bad("checkpoint_interval", value, f"steps must be > 0 and <= {MAX_STEPS}")
        return value
    if isinstance(value, str):
        if value == "auto":
            return value
        if value.endswith("s"):
            try:
                seconds = float(value[:-1])
            except ValueError:
                seconds = -1.0
            if math.isfinite(seconds) and seconds > MAX_DURATION_S:
                raise _bad("checkpoint_interval", value,
                           f"seconds must be <= {MAX_DURATION_S:.0f}")
            if math.isfinite(seconds) and seconds > 0:  # "infs" / "nans" parse as floats
                return value
        raise _bad("checkpoint_interval", value, _INTERVAL_WHY)
    raise _bad("checkpoint_interval", value, _INTERVAL_WHY)


_FAULT_KEYS = ("kind", "at_step", "attempt", "seconds", "rank")
#: The faults that take `seconds`: how much longer the save, or each step.
_TIMED_FAULTS = ("slow_save", "slow_steps")


def _one_of(choices: tuple[str, ...]) -> str:
    """`'a', 'b' or 'c'`"""
    return ", ".join(map(repr, choices[:-1])) + f" or {choices[-1]!r}"


def _faults(raw: object) -> tuple[FaultSpec, ...]:
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, list | tuple):
        raise _bad("faults", raw, "must be a list of {kind, at_step, attempt}")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise _bad(f"faults[{i}]", entry, "must be a table {kind, at_step, attempt}")
        item = _R.mapping(f"faults[{i}]", entry, known=_FAULT_KEYS)
        kind = next((k for k in FAULT_KINDS if k == item.get("kind")), None)
        if kind is None:
            raise _bad(f"faults[{i}].kind", item.get("kind"), f"must be {_one_of(FAULT_KINDS)}")
        at_step = _R.integer(f"faults[{i}].at_step", item.get("at_step"), minimum=1,
                             maximum=MAX_STEPS)
        attempt = None if item.get("attempt") is None else _R.integer(
            f"faults[{i}].attempt", item.get("attempt"), minimum=1, maximum=MAX_ATTEMPT)
        seconds = SLOW_SAVE_S
        if "seconds" in item:
            if kind not in _TIMED_FAULTS:
                raise _bad(f"faults[{i}].seconds", item["seconds"],
                           f"is for a {_one_of(_TIMED_FAULTS)} fault only, not {kind!r}")
            seconds = _R.number(f"faults[{i}].seconds", item["seconds"], minimum=0.0,
                                maximum=MAX_DURATION_S if kind == "slow_save" else MAX_SLEEP_S)
        elif kind == "slow_steps":
            raise _bad(f"faults[{i}].seconds", None,
                       "a 'slow_steps' fault needs the seconds each step is slowed by")
        rank = None if item.get("rank") is None else _R.integer(
            f"faults[{i}].rank", item.get("rank"), minimum=0, maximum=MAX_WORLD_SIZE - 1)
        out.append(FaultSpec(kind, at_step, attempt, seconds, rank))
    _no_overlap(out, raw)
    return tuple(out)


def _faults_within(faults: tuple[FaultSpec, ...], steps: int) -> None:
    """Every fault at a step the job reaches: one after `steps` would never fire, and a
    `slow_save` at the last step neither (that step's save is the final one, which no
    fault slows); `ConfigError` naming the first."""
    for i, spec in enumerate(faults):
        last = steps - 1 if spec.kind == "slow_save" else steps
        if spec.at_step > last:
            why = (f"must be below steps ({steps}): no periodic save is made at the last step"
                   if spec.kind == "slow_save"
                   else f"must be at most steps ({steps}): the job never reaches it")
            raise _bad(f"faults[{i}].at_step", spec.at_step, why)


def _no_overlap(faults: list[FaultSpec], raw: Sequence[object]) -> None:
    """The injector keeps one fault per step of an attempt on a rank: two that would both
    fire there are an error naming the second."""
    for i, spec in enumerate(faults):
        for j, other in enumerate(faults[:i]):
            if (spec.at_step, spec.attempt) != (other.at_step, other.attempt):
                continue
            if spec.rank is None and other.rank is None:
                raise _bad(f"faults[{i}]", raw[i], f"same at_step and attempt as faults[{j}]")
            if spec.rank is None or other.rank is None or spec.rank == other.rank:
                raise _bad(f"faults[{i}]", raw[i], f"same at_step and attempt as faults[{j}], "
                                                   "on a rank both hit")


def config_from_mapping(data: Mapping[str, object], *, base_dir: Path | None = None
                        ) -> TrainerConfig:
    """A trainer config's table (`ConfigTable`'s fields; a `TrainerFile` as the
    operators hold it, or what `load_config` read) as a `TrainerConfig`: every field
    through a typed reader, nothing a person typed is coerced."""
    _check_top_level(data)
    base = base_dir or Path.cwd()

    def path(name: str) -> Path | None:
        value = data.get(name)
        return None if value is None else _R.path(name, value, base=base)

    def integer(name: str, default: int, minimum: int, maximum: int) -> int:
        return _R.integer(name, data.get(name, default), minimum=minimum, maximum=maximum)

    def seconds(name: str, default: float, *, positive: bool,
                maximum: float = MAX_DURATION_S) -> float:
        value = data.get(name, default)
        if positive:
            return _R.number(name, value, above=0, maximum=maximum)
        return _R.number(name, value, minimum=0, maximum=maximum)

    model, data_spec = _model_and_data(data, base)
    optimizations = _optimizations(data.get("optimizations", {}))
    checkpoint_dir = path("checkpoint_dir")
    if checkpoint_dir is None:
        raise _bad("checkpoint_dir", None, "must be a path (a non-empty string)")
    hang = data.get("hang_timeout_s")
    rank_report = data.get("rank_report_s", 10.0)
    steps = integer("steps", 0, minimum=1, maximum=MAX_STEPS)
    faults = _faults(data.get("faults", []))
    _faults_within(faults, steps)
    return TrainerConfig(
        model=model,
        steps=steps,
        checkpoint_dir=checkpoint_dir,
        seed=integer("seed", 1234, minimum=0, maximum=2**63 - 1),
        batch_size=integer("batch_size", 256, minimum=1, maximum=MAX_BATCH_SIZE),
        lr_dense=_R.number("lr_dense", data.get("lr_dense", 0.05), above=0, maximum=MAX_LR),
        lr_sparse=_R.number("lr_sparse", data.get("lr_sparse", 0.05), above=0,
                            maximum=MAX_LR),
        num_workers=integer("num_workers", 1, minimum=0, maximum=MAX_NUM_WORKERS),
        prefetch=integer("prefetch", 4, minimum=1, maximum=MAX_PREFETCH),
        data_startup_latency_s=seconds("data_startup_latency_s", 0.0, positive=False,
                                       maximum=MAX_SLEEP_S),
        compile=_R.boolean("compile", data.get("compile", True)),
        compile_cache_dir=path("compile_cache_dir"),
        checkpoint_interval=_interval(data.get("checkpoint_interval", 50)),
        keep_last=integer("keep_last", 3, minimum=1, maximum=MAX_KEEP_LAST),
        grace_s=seconds("grace_s", 30.0, positive=True),
        log_every_s=seconds("log_every_s", 5.0, positive=True),
        step_sleep_s=seconds("step_sleep_s", 0.0, positive=False, maximum=MAX_SLEEP_S),
        hang_timeout_s=None if hang is None else seconds("hang_timeout_s", 0.0, positive=True),
        rank_report_s=None if rank_report is None else seconds("rank_report_s", 10.0,
                                                               positive=True),
        events_file=path("events_file"),
        faults=faults,
        optimizations=optimizations,
        data=data_spec,
    )


BUNDLED_DEFAULT = "dlrm_tiny"
_DLRM_FILE = Path(__file__).resolve().parent / "models" / "dlrm.py"
_DLRM_CODE: list[str] = []  # computed once per process: the bundled factory's source hash


def _dlrm_spec(config: ModelConfig) -> ModelSpec:
    if not _DLRM_CODE:
        _DLRM_CODE.append(code_identity(_DLRM_FILE, DLRM_FACTORY.split(":")[0]))
    arch = {k: v for k, v in config.to_dict().items()
            if k in ("embedding_dim", "dense_arch", "over_arch")}
    return ModelSpec(name=config.name, factory=DLRM_FACTORY, config=arch, code=_DLRM_CODE[0])


def _bundled_data(name: str) -> DataSpec:
    from airflow_ett.trainer.model_config import BUNDLED

    config = BUNDLED[name]
    return synthetic(config.num_dense, config.tables, config.ids_per_feature)


def _model_and_data(data: Mapping[str, object], base: Path) -> tuple[ModelSpec, DataSpec]:
    """`model`: a bundled DLRM's name or full config (its synthetic log unless `data`
    says otherwise), or an owner's factory `"pkg.module:build"` with `model_config`
    beside it and `data` required. One `ConfigError` line for anything wrong."""
    raw = data["model"]
    try:
        if isinstance(raw, str) and ":" in raw:
            code_path = data.get("model_code_path")
            spec = read_model_spec(raw, data.get("model_config"), code_path=None if
                                   code_path is None else _R.path("model_code_path",
                                                                  code_path, base=base))
            if "data" not in data:
                raise _bad("data", None, f"missing: model {raw!r} trains on files of yours "
                                         "(data = {format, paths, schema})")
        else:
            for own in ("model_config", "model_code_path"):
                if own in data:
                    raise _bad(own, data[own], "is for a model given by import path "
                                               "('pkg.module:build'); a bundled model's "
                                               "config is a mapping given as model")
            dlrm = resolve_model_config(raw)
            spec = _dlrm_spec(dlrm)
            if "data" not in data:
                return spec, synthetic(dlrm.num_dense, dlrm.tables, dlrm.ids_per_feature)
        return spec, read_data_spec(data["data"], base=base)
    except (ModelConfigError, ModelSpecError, DataSpecError) as exc:
        raise ConfigError(str(exc)) from None


#: A trainer config is a few KB (the model's tables, the optimizations, paths); past this
#: it is not one.
MAX_CONFIG_BYTES: Final = 1 << 20
#: The deepest a config nests (model.tables.<name>.<field> and a list): ample.
_MAX_DEPTH: Final = 16


def _check_top_level(data: object) -> None:
    """A table, with no field this trainer does not know and every required one present."""
    if not isinstance(data, Mapping):
        raise _bad("(top level)", data, "must be a table / JSON object")
    known = set(ConfigTable.__annotations__)
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise ConfigError(f"trainer config: unknown field(s) {unknown}; known: {sorted(known)}")
    for required in REQUIRED_FIELDS:
        if required not in data:
            raise ConfigError(f"trainer config: missing required field {required!r}")


def _optimizations(raw: object) -> Optimizations:
    """The `optimizations` table, every key a known switch and every value a boolean."""
    if not isinstance(raw, Mapping):
        raise _bad("optimizations", raw, "must be a table of booleans")
    opt_fields = {f.name for f in fields(Optimizations)}
    switches: dict[str, bool] = {}
    for key, value in raw.items():
        if key not in opt_fields:
            raise _bad(f"optimizations.{key}", value, f"unknown; known: {sorted(opt_fields)}")
        switches[key] = _R.boolean(f"optimizations.{key}", value)
    return replace(Optimizations(), **switches)


def load_config(path: str | Path) -> TrainerConfig:
    """The config file at `path` (JSON when it ends in `.json`, else TOML), read bounded:
    a regular file (a FIFO or `/dev/zero` behind a symlink would hang or exhaust the
    trainer) of at most `MAX_CONFIG_BYTES`, UTF-8, nested at most `_MAX_DEPTH` deep. Each
    of those wrong is a `ConfigError` (one line, exit 78), never a traceback. The reader of
    `TrainerFile` (`<job>/trainer.json`) and of a person's own config alike."""
    file = Path(path)
    what = "trainer config"
    try:
        if file.suffix == ".json":
            data: object = load_json(file, what=what, max_bytes=MAX_CONFIG_BYTES,
                                     max_depth=_MAX_DEPTH)
        else:
            data = load_toml(file, what=what, max_bytes=MAX_CONFIG_BYTES, max_depth=_MAX_DEPTH)
    except UntrustedFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"trainer config {file}: must be a table/object at the top level")
    return config_from_mapping(data, base_dir=file.parent)
