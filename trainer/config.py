"""The trainer's configuration: one file (TOML or JSON), validated before any work starts.

Every optimization has its own switch under `[optimizations]` so that the baseline and
the optimized job can be measured side by side with one setting changed. Bad values fail
at load with the field and value named: a job that would crash after ten minutes of
startup on a typo is exactly the waste this project exists to remove.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from airflow_ett.trainer.model_config import ModelConfig, ModelConfigError, resolve_model_config

FaultKind = Literal["raise", "kill", "hang"]


class ConfigError(ValueError):
    """A trainer config that cannot run; the message names the field and value."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Inject a failure after step `at_step` completes, on attempt `attempt` only (1-based;
    None: every attempt). `raise` is an application error, `kill` a SIGKILL of the
    process (an infra failure nobody reports), `hang` stops making progress until killed."""

    kind: FaultKind
    at_step: int
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class Optimizations:
    fast_batch: bool = True  # compile on a synthetic batch while the data pipeline starts
    parallel_init: bool = True  # pipeline, model, restore and compile overlap
    compile_cache: bool = True  # restore/save the compile cache around torch.compile
    async_checkpoint: bool = True  # stage, then write in the background


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    model: ModelConfig
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
    events_file: Path | None = None  # write events here instead of the ETT store
    faults: tuple[FaultSpec, ...] = ()
    optimizations: Optimizations = field(default_factory=Optimizations)

    # -- derived ---------------------------------------------------------------------
    def interval_steps(self) -> int | None:
        value = self.checkpoint_interval
        return value if isinstance(value, int) else None

    def interval_seconds(self) -> float | None:
        value = self.checkpoint_interval
        if isinstance(value, str) and value.endswith("s") and value != "auto":
            return float(value[:-1])
        return None

    def with_overrides(self, **changes: Any) -> TrainerConfig:
        return replace(self, **changes)


def _bad(name: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"trainer config: {name} = {value!r}: {why}")


def _interval(value: object) -> int | str:
    if isinstance(value, bool):
        raise _bad("checkpoint_interval", value, "give steps (int), seconds ('30s') or 'auto'")
    if isinstance(value, int):
        if value <= 0:
            raise _bad("checkpoint_interval", value, "steps must be > 0")
        return value
    if isinstance(value, str):
        if value == "auto":
            return value
        if value.endswith("s"):
            try:
                seconds = float(value[:-1])
            except ValueError:
                seconds = -1.0
            if seconds > 0:
                return value
        raise _bad("checkpoint_interval", value, "give steps (int), seconds ('30s') or 'auto'")
    raise _bad("checkpoint_interval", value, "give steps (int), seconds ('30s') or 'auto'")


def _faults(raw: object) -> tuple[FaultSpec, ...]:
    if not isinstance(raw, list):
        raise _bad("faults", raw, "must be a list of {kind, at_step, attempt}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise _bad(f"faults[{i}]", item, "must be a table {kind, at_step, attempt}")
        kind = item.get("kind")
        if kind not in ("raise", "kill", "hang"):
            raise _bad(f"faults[{i}].kind", kind, "must be 'raise', 'kill' or 'hang'")
        at_step = item.get("at_step")
        if not isinstance(at_step, int) or isinstance(at_step, bool) or at_step < 1:
            raise _bad(f"faults[{i}].at_step", at_step, "must be an integer >= 1")
        attempt = item.get("attempt")
        if attempt is not None and (not isinstance(attempt, int) or attempt < 1):
            raise _bad(f"faults[{i}].attempt", attempt, "must be an integer >= 1 or absent")
        out.append(FaultSpec(kind, at_step, attempt))
    return tuple(out)


def config_from_mapping(data: Mapping[str, Any], *, base_dir: Path | None = None
                        ) -> TrainerConfig:
    known = {f.name for f in fields(TrainerConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"trainer config: unknown field(s) {unknown}; known: {sorted(known)}")
    for required in ("model", "steps", "checkpoint_dir"):
        if required not in data:
            raise ConfigError(f"trainer config: missing required field {required!r}")
    base = base_dir or Path.cwd()

    def path(name: str) -> Path | None:
        value = data.get(name)
        if value is None:
            return None
        if not isinstance(value, str | os.PathLike):
            raise _bad(name, value, "must be a path")
        p = Path(value).expanduser()
        return p if p.is_absolute() else base / p

    def number(name: str, default: float, *, minimum: float = 0.0, integer: bool = False,
               strict: bool = False) -> Any:
        value = data.get(name, default)
        ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok_type:
            raise _bad(name, value, "must be an integer" if integer else "must be a number")
        if value < minimum or (strict and value == minimum):
            raise _bad(name, value, f"must be {'>' if strict else '>='} {minimum}")
        return value

    try:
        model = resolve_model_config(data["model"])
    except ModelConfigError as exc:
        raise ConfigError(str(exc)) from None
    opts_raw = data.get("optimizations", {})
    if not isinstance(opts_raw, Mapping):
        raise _bad("optimizations", opts_raw, "must be a table of booleans")
    opt_fields = {f.name for f in fields(Optimizations)}
    for key, value in opts_raw.items():
        if key not in opt_fields:
            raise _bad(f"optimizations.{key}", value, f"unknown; known: {sorted(opt_fields)}")
        if not isinstance(value, bool):
            raise _bad(f"optimizations.{key}", value, "must be true or false")
    checkpoint_dir = path("checkpoint_dir")
    assert checkpoint_dir is not None
    return TrainerConfig(
        model=model,
        steps=number("steps", 0, minimum=1, integer=True),
        checkpoint_dir=checkpoint_dir,
        seed=number("seed", 1234, integer=True),
        batch_size=number("batch_size", 256, minimum=1, integer=True),
        lr_dense=number("lr_dense", 0.05, strict=True),
        lr_sparse=number("lr_sparse", 0.05, strict=True),
        num_workers=number("num_workers", 1, integer=True),
        prefetch=number("prefetch", 4, minimum=1, integer=True),
        data_startup_latency_s=number("data_startup_latency_s", 0.0),
        compile=bool(data.get("compile", True)),
        compile_cache_dir=path("compile_cache_dir"),
        checkpoint_interval=_interval(data.get("checkpoint_interval", 50)),
        keep_last=number("keep_last", 3, minimum=1, integer=True),
        grace_s=number("grace_s", 30.0, strict=True),
        log_every_s=number("log_every_s", 5.0, strict=True),
        step_sleep_s=number("step_sleep_s", 0.0),
        hang_timeout_s=(None if data.get("hang_timeout_s") is None
                        else number("hang_timeout_s", 0.0, strict=True)),
        events_file=path("events_file"),
        faults=_faults(data.get("faults", [])),
        optimizations=Optimizations(**opts_raw),
    )


def load_config(path: str | Path) -> TrainerConfig:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"trainer config file not found: {file}")
    text = file.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"trainer config {file}: not valid "
                          f"{'JSON' if file.suffix == '.json' else 'TOML'}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"trainer config {file}: must be a table/object at the top level")
    return config_from_mapping(data, base_dir=file.parent)
