"""Checks that run before the trainer allocates, compiles or restores anything.

A config that is well-typed can still be impossible here: tables that cannot fit in
memory, a checkpoint directory that is a file or not writable, one that holds another
model's checkpoints, a compile cache nobody can write to. Found late, each is a traceback
(exit 1) after minutes of startup, and Airflow retries it, burning GPU time on a failure
that cannot heal. Found here, each is one line naming the field and value and exit 78
(`EXIT_BAD_CONFIG`), which the operator turns into a failure without retries.

The memory estimate is pure arithmetic (no torch): `training_job(...)` runs it at DAG
parse time against `PARSE_TIME_MEMORY_CAP_BYTES`, the trainer at start against the
memory actually available. It is a lower bound of what the trainer allocates (parameters,
their gradients and optimizer state, the batches in flight, activations), so it refuses
only configs that cannot run, never a tight one that might.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from airflow_ett.ett.events import MAX_WORLD_SIZE
from airflow_ett.trainer.readers import Reader, show

if TYPE_CHECKING:
    from airflow_ett.trainer.config import TrainerConfig

class Shapes(Protocol):
    """What the memory estimate reads of a model (a bundled `ModelConfig` has it all)."""

    @property
    def name(self) -> str: ...
    @property
    def num_dense(self) -> int: ...
    @property
    def tables(self) -> tuple[tuple[str, int], ...]: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def dense_arch(self) -> tuple[int, ...]: ...
    @property
    def over_arch(self) -> tuple[int, ...]: ...
    @property
    def ids_per_feature(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ModelShapes:
    """`Shapes` of any model: the tables and dense width from the data schema, the rest
    from the model config's conventional keys (`embedding_dim`, and MLP layer lists
    `dense_arch` / `over_arch` when it has them)."""

    name: str
    num_dense: int
    tables: tuple[tuple[str, int], ...]
    embedding_dim: int
    dense_arch: tuple[int, ...]
    over_arch: tuple[int, ...]
    ids_per_feature: int


def _layers(value: object) -> tuple[int, ...]:
    if isinstance(value, list | tuple) and all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value):
        return tuple(value)
    return ()


def shapes_of(cfg: TrainerConfig) -> ModelShapes | None:
    """The job's shapes for the estimate; None when its model config says no
    `embedding_dim` (an integer): the table memory of such a model is unknown before it
    is built, and the estimate is skipped rather than guessed."""
    config, schema = cfg.model.config, cfg.data.schema
    dim = config.get("embedding_dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        return None
    return ModelShapes(name=cfg.model.name, num_dense=schema.num_dense, tables=schema.tables,
                       embedding_dim=dim, dense_arch=_layers(config.get("dense_arch")),
                       over_arch=_layers(config.get("over_arch")),
                       ids_per_feature=max(f.max_ids for f in schema.sparse))


FP32: Final = 4
INT64: Final = 8
INT32: Final = 4
INT64_MAX: Final = 2**63 - 1
# Per process, at DAG parse time, where the worker's memory is unknown: more than any
# single host or accelerator holds for one training process today (1 TiB).
PARSE_TIME_MEMORY_CAP_BYTES: Final = 2**40
# A cap of one's own (bytes), e.g. on a worker shared with other jobs: the trainer uses
# the smaller of it and the memory available; at parse time it replaces the cap above.
MEMORY_LIMIT_ENV: Final = "ETT_MEMORY_LIMIT_BYTES"
# What one data worker process costs before it holds any batch: a spawned interpreter
# with numpy and `data_gen` imported. Measured 17.5 MB of memory unique to each worker
# (USS; 33 MB RSS) with Python 3.11 and numpy 2.4 on x86-64 Linux: 16 MiB is a lower bound.
WORKER_PROCESS_BYTES: Final = 16 * 2**20


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes one trainer process needs, by what needs them (see `estimate_memory`)."""

    tables: int  # embedding rows x dim x 4, with gradients and optimizer state
    dense: int  # dense and over arch parameters, gradients, optimizer state
    batches: int  # batch tensors in flight: the workers' queues, those being built, the step's
    activations: int  # forward values kept for backward, for one batch
    batches_in_flight: int
    bytes_per_example: int
    workers: int = 0  # the data worker processes themselves (host memory)

    @property
    def model(self) -> int:
        return self.tables + self.dense

    @property
    def total(self) -> int:
        return self.tables + self.dense + self.batches + self.activations + self.workers


def _mlp_params(inputs: int, sizes: tuple[int, ...]) -> int:
    total, prev = 0, inputs
    for size in sizes:
        total += prev * size + size
        prev = size
    return total


def batches_in_flight(prefetch: int, num_workers: int) -> int:
    """Batches held at once, as `data_workers.WorkerPool` holds them: each of `num_workers`
    workers has its own queue of `ceil(prefetch / num_workers)` (at least 1) and builds
    one more while it waits to put it, and the step trains on one. With no workers the
    consumer builds its one batch inline."""
    if num_workers <= 0:
        return 1
    per_worker = max(1, -(-prefetch // num_workers))
    return num_workers * (per_worker + 1) + 1


def estimate_memory(model: Shapes, batch_size: int, *, prefetch: int = 4,
                    num_workers: int = 1, world_size: int = 1) -> MemoryEstimate:
    """Lower-bound bytes per trainer process.

    One process (`world_size` 1): plain embedding bags with dense gradients and Adagrad,
    so each table costs 3x rows x dim x 4 bytes (weights, gradient, Adagrad's sum). Sharded
    (`world_size` > 1): the tables are split over the processes, the optimizer is fused
    into backward (no gradient kept) with row-wise Adagrad (one float per row).
    Batches: dense floats, labels, ids (int64) and lengths (int32) for every example;
    `batches_in_flight` of them. Workers: `WORKER_PROCESS_BYTES` for each process.
    """
    rows = sum(r for _, r in model.tables)
    dim = model.embedding_dim
    if world_size <= 1:
        tables = 3 * rows * dim * FP32
    else:
        tables = -(-(rows * dim * FP32 + rows * FP32) // world_size)
    features = len(model.tables)
    interaction = dim + (features + 1) * features // 2
    dense_params = (_mlp_params(model.num_dense, model.dense_arch)
                    + _mlp_params(interaction, model.over_arch))
    per_example = (model.num_dense * FP32 + FP32  # dense features, label
                   + features * model.ids_per_feature * INT64 + features * INT32)
    in_flight = batches_in_flight(prefetch, num_workers)
    activations = batch_size * FP32 * (features * dim + sum(model.dense_arch)
                                       + interaction + sum(model.over_arch))
    return MemoryEstimate(
        tables=tables, dense=3 * dense_params * FP32,
        batches=in_flight * batch_size * per_example, activations=activations,
        batches_in_flight=in_flight, bytes_per_example=per_example,
        workers=max(num_workers, 0) * WORKER_PROCESS_BYTES,
    )


def check_memory(model: Shapes | None, batch_size: int, *, prefetch: int, num_workers: int,
                 world_size: int, host_available: int | None, device_available: int | None,
                 processes_per_host: int, reader: Reader, where_available: str) -> None:
    """Refuse a config whose estimate exceeds what is there, naming the field that takes
    the most. `device_available` None: the model lives in host memory (CPU training).
    `model` None: its shapes are unknown until it is built (`shapes_of`): nothing to check."""
    if model is None:
        return
    est = estimate_memory(model, batch_size, prefetch=prefetch, num_workers=num_workers,
                          world_size=world_size)
    one_batch = est.batches // est.batches_in_flight
    # (memory, available, procs sharing it, bytes for: the model, batches, worker processes)
    needs: list[tuple[str, int | None, int, int, int, int]]
    if device_available is not None:  # model and the step's batch on the device
        needs = [("device memory", device_available, 1, est.model,
                  est.activations + one_batch, 0),
                 ("host memory", host_available, processes_per_host, 0, est.batches,
                  est.workers)]
    else:
        needs = [("", host_available, processes_per_host, est.model,
                  est.activations + est.batches, est.workers)]
    for kind, available, procs, model_part, batch_part, worker_part in needs:
        need = (model_part + batch_part + worker_part) * procs
        if available is None or need <= available:
            continue
        per = f" x {procs} processes on this host" if procs > 1 else ""
        budget = f"{human(available)} {where_available}" + (f" ({kind})" if kind else "")
        largest = max(model_part, batch_part, worker_part)
        if model_part == largest:
            raise _model_too_big(model, batch_size, world_size, reader,
                                 f"{human(need)}{per}", budget)
        if worker_part == largest:
            raise reader.fail(
                "num_workers", num_workers,
                f"{num_workers} data worker processes need an estimated {human(need)}{per} "
                f"(at least {human(WORKER_PROCESS_BYTES)} each, plus {est.batches_in_flight} "
                f"batches in flight; model {human(est.model)}), more than the {budget}; use "
                "fewer workers")
        raise reader.fail(
            "batch_size", batch_size,
            f"batches need an estimated {human(need)}{per} ({est.bytes_per_example} bytes "
            f"per example x {est.batches_in_flight} batches in flight: prefetch {prefetch}, "
            f"{num_workers} workers, the step; plus activations; model {human(est.model)}), "
            f"more than the {budget}; use a smaller batch_size or prefetch")


def _model_too_big(model: Shapes, batch_size: int, world_size: int, reader: Reader,
                   need: str, budget: str) -> ValueError:
    name, rows = max(model.tables, key=lambda t: t[1])
    layout = ("weights, gradients and Adagrad state in one process"
              if world_size <= 1 else f"sharded over {world_size} processes")
    return reader.fail(
        f"model.tables[{name}]", rows,
        f"the model needs an estimated {need} ({len(model.tables)} table(s), "
        f"{sum(r for _, r in model.tables):,} rows x embedding_dim {model.embedding_dim} x "
        f"4 bytes, {layout}; batch_size {batch_size}), more than the {budget}; use fewer or "
        "smaller tables or more processes")


def check_cursor_range(steps: int, batch_size: int, world_size: int, reader: Reader) -> None:
    """The data cursor after the last step, `steps x batch_size x world_size` examples,
    must fit the 64-bit integer every event and both store backends keep it in: past it
    the trainer's progress events would be refused, and the job's effective time lost."""
    if steps * batch_size * world_size > INT64_MAX:
        raise reader.fail("steps", steps,
                          f"x batch_size {batch_size} x {world_size} process(es) is a data "
                          f"cursor past {INT64_MAX} (64-bit), which no event can record")


def env_memory_limit(reader: Reader) -> int | None:
    raw = os.environ.get(MEMORY_LIMIT_ENV)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise reader.fail(MEMORY_LIMIT_ENV, raw, "must be a whole number of bytes") from None
    if value <= 0:
        raise reader.fail(MEMORY_LIMIT_ENV, raw, "must be > 0 bytes")
    return value


def check_parse_time_memory(model: Shapes | None, batch_size: int, *, prefetch: int,
                            num_workers: int, nproc: int, reader: Reader) -> None:
    """At DAG parse time the worker's memory is unknown: check against a fixed cap."""
    limit = env_memory_limit(reader)
    check_memory(model, batch_size, prefetch=prefetch, num_workers=num_workers,
                 world_size=nproc, host_available=limit or PARSE_TIME_MEMORY_CAP_BYTES,
                 device_available=None, processes_per_host=1, reader=reader,
                 where_available=(f"limit set by {MEMORY_LIMIT_ENV}" if limit
                                  else "parse-time cap per trainer process"))


# -- run time ------------------------------------------------------------------------


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available_bytes() -> int | None:
    """Memory this process may still take: the host's available memory, and the
    container's cgroup (v2) headroom when it is smaller. None when nothing says."""
    found: list[int] = []
    try:
        import psutil

        found.append(int(psutil.virtual_memory().available))
    except Exception:
        try:
            for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
        except (OSError, ValueError, IndexError):
            pass
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int(
        "/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append(max(limit - used, 0))
    return min(found) if found else None


def writable_dir(name: str, path: Path, reader: Reader) -> None:
    """Create `path` if needed and write a file in it; refuse with the reason."""
    if path.exists() and not path.is_dir():
        raise reader.fail(name, str(path), "exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise reader.fail(name, str(path), f"cannot create it: {exc.strerror or exc}") from None
    try:
        fd, tmp = tempfile.mkstemp(dir=path, prefix=".ett-preflight-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise reader.fail(name, str(path), f"not writable: {exc.strerror or exc}") from None


def check_checkpoint_owner(cfg: TrainerConfig, reader: Reader) -> None:
    """Refuse a checkpoint directory holding another model's checkpoints: restoring them
    fails on shapes, and retention would then delete them. The model is read from each
    committed marker's `extra` (`model_identity`, written by the trainer's saves; older
    checkpoints carry only the model's `model` name)."""
    from airflow_ett.trainer.checkpoint import read_marker
    from airflow_ett.trainer.state import read_train_extra

    mine_id, mine_name = cfg.model_identity, cfg.model.name
    try:
        entries = sorted(p for p in cfg.checkpoint_dir.iterdir()
                         if p.name.startswith("step-") and p.is_dir())
    except OSError:
        return
    for path in entries:
        try:
            extra = read_train_extra(read_marker(path).extra, where=path.name)
        except (OSError, ValueError):
            continue  # not committed or unreadable: restore skips it with a reason
        theirs_id, theirs_name = extra.get("model_identity"), extra.get("model")
        if (theirs_id is not None and theirs_id != mine_id) or (
                theirs_id is None and theirs_name is not None and theirs_name != mine_name):
            raise reader.fail(
                "checkpoint_dir", str(cfg.checkpoint_dir),
                f"holds checkpoints of another model ({path.name}: model {theirs_name!r}, "
                f"identity {theirs_id}) but this job trains {mine_name!r} (identity "
                f"{mine_id}): give the job a directory of its own")


def _env_int(name: str, default: int, reader: Reader) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_WORLD_SIZE:
        raise reader.fail(name, raw, f"must be an integer >= 1 and <= {MAX_WORLD_SIZE} "
                                     "(torchrun sets it)")
    return int(raw)


def preflight(cfg: TrainerConfig, *, prewarm: bool = False, prewarm_world_size: int | None = None,
              cuda_free: Callable[[], int | None] | None = None) -> None:
    """Everything that can be known to fail before the trainer starts: raises
    `ConfigError` (the CLI prints it and exits 78). `cuda_free`: free device bytes, None
    for CPU training (default: asks torch)."""
    from airflow_ett.trainer.config import ConfigError

    r = Reader("trainer config", ConfigError)
    world = _env_int("WORLD_SIZE", 1, r)
    local = _env_int("LOCAL_WORLD_SIZE", world, r)
    if prewarm_world_size is not None and not 1 <= prewarm_world_size <= MAX_WORLD_SIZE:
        raise ConfigError(f"--prewarm-world-size = {prewarm_world_size}: must be >= 1 and "
                          f"<= {MAX_WORLD_SIZE}")
    check_cursor_range(cfg.steps, cfg.batch_size, world, r)
    limit = env_memory_limit(r)
    host = host_available_bytes()
    if limit is not None:
        host = limit if host is None else min(host, limit)
    device = (cuda_free or _cuda_free)()
    check_memory(shapes_of(cfg), cfg.batch_size, prefetch=cfg.prefetch, num_workers=cfg.num_workers,
                 world_size=world, host_available=host, device_available=device,
                 processes_per_host=local, reader=r, where_available="available")
    cache_on = cfg.compile and cfg.optimizations.compile_cache
    if prewarm and not (cache_on and cfg.compile_cache_dir is not None):
        raise ConfigError("--prewarm: needs compile = true, "
                          "optimizations.compile_cache = true and a compile_cache_dir (have "
                          f"compile = {cfg.compile}, compile_cache = "
                          f"{cfg.optimizations.compile_cache}, compile_cache_dir = "
                          f"{show(cfg.compile_cache_dir)})")
    if cache_on and cfg.compile_cache_dir is not None:
        writable_dir("compile_cache_dir", cfg.compile_cache_dir, r)
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cfg.compile and inductor:
        writable_dir("TORCHINDUCTOR_CACHE_DIR", Path(inductor), r)
    if cfg.events_file is not None:
        if cfg.events_file.is_dir():
            raise r.fail("events_file", str(cfg.events_file), "is a directory")
        writable_dir("events_file's directory", cfg.events_file.parent, r)
    if prewarm:
        return  # a prewarm neither reads nor writes checkpoints
    writable_dir("checkpoint_dir", cfg.checkpoint_dir, r)
    check_checkpoint_owner(cfg, r)


def _cuda_free() -> int | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        local = int(os.environ.get("LOCAL_RANK", "0"))
        free, _total = torch.cuda.mem_get_info(local)
        return int(free)
    except Exception:
        return None
