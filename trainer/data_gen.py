"""The numpy core of the synthetic click log: the spec, sample generation and the worker pool.

Split from `data.py` on purpose: this module imports numpy and the standard library only,
never torch. The pipeline's worker processes are *spawned* (forking a process that holds
torch's threads is unsafe, and the trainer runs under torchrun), so each worker pays for
every import of the modules it unpickles. Keeping torch out of them makes a worker start in
a fraction of a second instead of seconds; `data.py` turns the arrays into tensors and a
`KeyedJaggedTensor` in the consumer, where torch is already loaded.

Determinism: sample `i` is a pure function of `(seed, i)`, computed with counter-based
hashing (splitmix64 over uint64 arrays) rather than a sequential RNG. Every batch can be
generated alone, in any worker, in any order, so resuming at cursor `c` reproduces exactly
the samples from `c` on, and the number of workers or ranks never changes the data.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.queues import Queue as MPQueue
from multiprocessing.sharedctypes import Synchronized
from typing import NamedTuple, ParamSpec, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "ClickLogSpec",
    "RawBatch",
    "Source",
    "WorkerPool",
    "check_cursor",
    "generate_rank_batch",
    "generate_samples",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)

# Stream tags: independent hash streams derived from one seed.
_TAG_SAMPLES = 0x5A4D_504C_4553  # per-sample values (dense, ids, label noise)
_TAG_PARAMS = 0x5041_5241_4D53  # the hidden "true model" the labels come from

# Label model. The logit is  LABEL_BIAS + dense part + sparse part, each part scaled to a
# standard deviation of about 1.5, so the best achievable log loss (about 0.45) is well
# below the 0.69 of a constant guess: a model that learns shows a clearly falling loss.
LABEL_BIAS = -0.5
_PART_STD = 1.5
# Ids are skewed towards low rows (id = floor(n * u**ID_SKEW)): real click logs have hot
# ids, and a per-id effect is only learnable for ids seen often enough.
ID_SKEW = 2.0


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's output function, vectorised: a bijective, well-mixing uint64 hash.

    numpy wraps uint64 array arithmetic modulo 2**64 silently, which is what we want.
    """
    z = x + _GOLDEN
    z ^= z >> _S30
    z *= _MUL1
    z ^= z >> _S27
    z *= _MUL2
    z ^= z >> _S31
    return z


def _mix(value: int) -> int:
    """splitmix64 of one Python int (kept in uint64 arrays so that overflow wraps quietly)."""
    return int(_splitmix64(np.array([value & _MASK64], dtype=np.uint64))[0])


def _unit(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Map hashes to uniform floats in [0, 1) using their top 53 bits (exact in float64)."""
    return (h >> _S11).astype(np.float64) * (1.0 / (1 << 53))


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_cursor(cursor: object, what: str = "cursor") -> int:
    """Return `cursor` as an int, or raise ValueError naming it: cursors are ints >= 0."""
    if not isinstance(cursor, int | np.integer) or isinstance(cursor, bool) or cursor < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {cursor!r}")
    return int(cursor)


def _spec_error(name: str, value: object, rule: str) -> ValueError:
    return ValueError(f"ClickLogSpec.{name} {rule}, got {value!r}")


def _spec_tables(raw: object) -> list[tuple[str, int]]:
    """`ClickLogSpec.tables` as (name, int rows) pairs: non-empty, names unique."""
    bad = _spec_error
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise bad("tables", raw, "must be a sequence of (name, num_embeddings)")
    tables: list[tuple[str, int]] = []
    for i, entry in enumerate(raw):
        if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise bad(f"tables[{i}]", entry, "must be a (name, num_embeddings) pair")
        name, rows = entry
        if not isinstance(name, str) or not name:
            raise bad(f"tables[{i}] name", name, "must be a non-empty string")
        if not _is_int(rows) or int(rows) <= 0:
            raise bad(f"tables[{i}] ({name!r}) num_embeddings", rows, "must be an integer > 0")
        tables.append((name, int(rows)))
    if not tables:
        raise bad("tables", raw, "must name at least one sparse feature")
    names = [n for n, _ in tables]
    if len(set(names)) != len(names):
        raise bad("tables", names, "must have unique feature names")
    return tables


@dataclass(frozen=True)
class ClickLogSpec:
    """What the synthetic click log looks like: the only input besides the cursor.

    `tables` lists `(feature name, num_embeddings)` in KeyedJaggedTensor key order; every
    sample has exactly `ids_per_feature` ids per feature, so batch shapes never vary and a
    compiled model never recompiles for the data. `batch_size` is per rank. Lists given for
    `tables` (from JSON or TOML) are normalised to tuples, so the spec stays hashable and
    picklable into spawned workers.
    """

    seed: int
    num_dense: int
    tables: tuple[tuple[str, int], ...]
    ids_per_feature: int
    batch_size: int

    def __post_init__(self) -> None:
        bad = _spec_error
        if not _is_int(self.seed) or not 0 <= int(self.seed) <= _MASK64:
            raise bad("seed", self.seed, "must be an integer in [0, 2**64)")
        if not _is_int(self.num_dense) or int(self.num_dense) < 0:
            raise bad("num_dense", self.num_dense, "must be an integer >= 0")
        if not _is_int(self.ids_per_feature) or int(self.ids_per_feature) <= 0:
            raise bad("ids_per_feature", self.ids_per_feature, "must be an integer > 0")
        if not _is_int(self.batch_size) or int(self.batch_size) <= 0:
            raise bad("batch_size", self.batch_size, "must be an integer > 0")
        tables = _spec_tables(self.tables)
        for attr in ("seed", "num_dense", "ids_per_feature", "batch_size"):
            object.__setattr__(self, attr, int(getattr(self, attr)))
        object.__setattr__(self, "tables", tuple(tables))

    @property
    def feature_names(self) -> list[str]:
        """The KJT keys, in order."""
        return [name for name, _ in self.tables]

    @property
    def num_features(self) -> int:
        return len(self.tables)

    @property
    def max_ids(self) -> tuple[int, ...]:
        """Ids per sample of each feature (all `ids_per_feature`): the fast batch's."""
        return (self.ids_per_feature,) * len(self.tables)

    def prepare(self) -> ClickLogSpec:
        """Nothing to index: every sample is generated from its cursor."""
        return self

    def rank_batch(self, cursor: int, rank: int = 0, world_size: int = 1) -> RawBatch:
        return generate_rank_batch(self, cursor, rank, world_size)


class RawBatch(NamedTuple):
    """One rank's batch as numpy arrays: what crosses the process boundary.

    `values` (int64) and `lengths` (int32, `num_features * rows`) are the sparse ids in
    the KeyedJaggedTensor's key-major order. `cursor_start/end` are the GLOBAL range of
    the step (all ranks together), not this rank's rows. `skipped` counts this rank's
    rows of that range that could not be read (bad rows: the batch has that many rows
    fewer), `problems` says what was wrong with the first few, each naming file, row and
    column.
    """

    cursor_start: int
    cursor_end: int
    dense: npt.NDArray[np.float32]
    values: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int32]
    labels: npt.NDArray[np.float32]
    skipped: int = 0
    problems: tuple[str, ...] = ()


class Source(Protocol):
    """Where a pipeline's batches come from: the generated log (`ClickLogSpec`) or the
    owner's files (`files.FileSource`). Picklable (it crosses into spawned workers),
    torch-free. `prepare` runs once, in the consumer, before workers start (indexing
    files: what every worker then shares); `rank_batch` is a pure function of the cursor
    for a prepared source."""

    @property
    def batch_size(self) -> int: ...

    @property
    def feature_names(self) -> list[str]: ...

    @property
    def num_dense(self) -> int: ...

    @property
    def max_ids(self) -> tuple[int, ...]: ...

    def prepare(self) -> Source: ...

    def rank_batch(self, cursor: int, rank: int = 0, world_size: int = 1) -> RawBatch: ...


class _Params:
    """The hidden labelling model of one seed: dense weights and per-feature id-effect keys.

    Per-id effects are hashed on the fly from (feature key, id) instead of being stored,
    so tables of any size cost no memory.
    """

    def __init__(self, spec: ClickLogSpec) -> None:
        seed_key = _mix(spec.seed)
        self.sample_key = np.uint64(_mix(seed_key ^ _TAG_SAMPLES))
        param_key = _mix(seed_key ^ _TAG_PARAMS)
        d = spec.num_dense
        w_hash = _splitmix64(np.uint64(param_key) + np.arange(d, dtype=np.uint64) * _GOLDEN)
        self.dense_w = 2.0 * _unit(w_hash) - 1.0  # U(-1, 1): variance 1/3
        # x ~ U(-sqrt3, sqrt3) has variance 1, so var(x @ w) = d / 3.
        self.dense_scale = _PART_STD / math.sqrt(d / 3.0) if d else 0.0
        f_idx = np.arange(1, spec.num_features + 1, dtype=np.uint64)
        self.feature_keys = _splitmix64(np.uint64(param_key ^ 0xFEA7) + f_idx * _MUL1)
        # Mean of L effects U(-1, 1) per feature, summed over F features: var ~ F / (3 L).
        var = spec.num_features / (3.0 * spec.ids_per_feature)
        self.sparse_scale = _PART_STD / math.sqrt(var)
        slots = spec.num_dense + spec.num_features * spec.ids_per_feature + 1
        s_idx = np.arange(1, slots + 1, dtype=np.uint64)
        self.slot_keys = _splitmix64(self.sample_key ^ (s_idx * _MUL2))
        self.rows = np.array([rows for _, rows in spec.tables], dtype=np.float64)


_PARAMS_CACHE: dict[ClickLogSpec, _Params] = {}
_PARAMS_LOCK = threading.Lock()


def _params(spec: ClickLogSpec) -> _Params:
    with _PARAMS_LOCK:
        params = _PARAMS_CACHE.get(spec)
        if params is None:
            if len(_PARAMS_CACHE) > 32:
                _PARAMS_CACHE.clear()
            params = _PARAMS_CACHE[spec] = _Params(spec)
        return params


def generate_samples(
    spec: ClickLogSpec, first: int, count: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Samples `[first, first + count)` as `(dense [n, D], ids [F, n, L], labels [n])`.

    Each sample hashes its index into one uint64 per slot (D dense values, F*L ids, one
    label draw); nothing depends on neighbouring samples. Labels are Bernoulli draws
    (from the sample's own hashed uniform) of sigmoid(bias + w.x + per-id effects), a
    fixed function of the features that a DLRM can learn.
    """
    first = check_cursor(first, "first sample")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count!r}")
    p = _params(spec)
    d, f, ell = spec.num_dense, spec.num_features, spec.ids_per_feature
    idx = np.arange(count, dtype=np.uint64) + np.uint64(first)
    row = _splitmix64(p.sample_key + idx * _GOLDEN)  # [n]
    h = _splitmix64(row[:, None] ^ p.slot_keys[None, :])  # [n, slots]
    u = _unit(h)
    x = (2.0 * u[:, :d] - 1.0) * math.sqrt(3.0)  # [n, D], unit variance
    dense = x.astype(np.float32)
    u_ids = u[:, d : d + f * ell].reshape(count, f, ell)
    rows = p.rows[None, :, None]
    ids = np.minimum(np.floor(rows * u_ids**ID_SKEW), rows - 1).astype(np.int64)  # [n, F, L]
    effect_h = _splitmix64(p.feature_keys[None, :, None] + ids.astype(np.uint64) * _GOLDEN)
    effects = (2.0 * _unit(effect_h) - 1.0).mean(axis=2).sum(axis=1)  # [n]
    logit = LABEL_BIAS + p.sparse_scale * effects
    if d:
        logit = logit + p.dense_scale * (dense.astype(np.float64) @ p.dense_w)
    prob = 1.0 / (1.0 + np.exp(-logit))
    labels = (u[:, -1] < prob).astype(np.float32)
    return dense, np.ascontiguousarray(ids.transpose(1, 0, 2)), labels


def generate_rank_batch(
    spec: ClickLogSpec, cursor: int, rank: int = 0, world_size: int = 1
) -> RawBatch:
    """Rank `rank`'s share of the global batch at `cursor`: rows `[c + r*B, c + (r+1)*B)`.

    The returned cursor range is the global one, `[c, c + W*B)`, so progress reported by
    rank 0 moves the shared cursor by the whole step.
    """
    cursor = check_cursor(cursor)
    _check_rank(rank, world_size)
    b = spec.batch_size
    dense, ids, labels = generate_samples(spec, cursor + rank * b, b)
    lengths = np.full(spec.num_features * b, spec.ids_per_feature, dtype=np.int32)
    return RawBatch(cursor, cursor + world_size * b, dense, ids.reshape(-1), lengths, labels)


def _check_rank(rank: object, world_size: object) -> None:
    if not _is_int(world_size) or int(world_size) < 1:  # type: ignore[call-overload]
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not _is_int(rank) or not 0 <= int(rank) < int(world_size):  # type: ignore[call-overload]
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")


# --------------------------------------------------------------------------- worker pool

_PUT_POLL_S = 0.2  # how often a blocked worker checks for stop and for its parent's death
_START_POLL_S = 0.01  # how often a connected worker looks for its start cursor
_SLEEP_POLL_S = 0.05  # how often a worker in its startup latency checks for stop


class _StopFlag:
    """A lock-free shared stop flag (one byte of shared memory).

    Not `multiprocessing.Event`: its `set()` waits for every sleeper in `wait()` to wake,
    so a worker killed while waiting (SIGKILL, the OOM killer) makes `set()` -- and so
    `close()` -- hang forever. A byte that workers poll cannot deadlock.
    """

    def __init__(self, ctx: SpawnContext) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds`; return early (True) when the flag is set."""
        deadline = time.monotonic() + seconds
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(_SLEEP_POLL_S, left))
        return True
_GET_POLL_S = 0.1  # how often a waiting consumer checks that its worker is alive


class _Made(NamedTuple):
    """A worker's message: batch `number` (of the pool's sequence: worker k of n makes
    k, k+n, ...), made. One writer (`_worker_main`), one reader (`WorkerPool.get`)."""

    number: int
    batch: RawBatch


class _Failed(NamedTuple):
    """A worker's last message: it failed making batch `number`, at `cursor`."""

    number: int
    cursor: int
    traceback: str


_Message = _Made | _Failed
_P = ParamSpec("_P")


def _worker_entry(main: Callable[_P, int], *args: _P.args, **kwargs: _P.kwargs) -> None:
    """Process target: run the worker, then leave with `os._exit`.

    Skipping the interpreter's teardown matters: when the parent's main script imports
    torch, spawn re-imports it in the worker, and a normal exit then spends 0.5-2 s tearing
    torch down, which `close()` would otherwise wait for. Everything worth flushing has
    been flushed by then (see `_worker_main`).
    """
    code = 1
    try:
        code = main(*args, **kwargs)
    finally:
        os._exit(code)


def _worker_main(
    spec: Source,
    worker_id: int,
    num_workers: int,
    start_at: Synchronized[int],  # the start cursor, shared: -1 while unknown
    rank: int,
    world_size: int,
    out: MPQueue[_Message],
    stop: _StopFlag,
    parent_pid: int,
    startup_latency_s: float,
    fail_at: int | None,
) -> int:
    """Worker `k` of `n`: makes batches k, k+n, k+2n, ... and puts them on its own queue.

    It exits when `stop` is set or when its parent has died (a trainer killed with SIGKILL
    must not leave orphans producing into a pipe nobody reads). On those exits it does not
    wait to flush its queue (`cancel_join_thread`), so it can always leave promptly. An
    exception is reported as an ("error", ...) message naming the cursor, flushed, and the
    exit code is 1. Returns the exit code. Connected, it waits for `start_at` to be known
    (a warm spare's pipeline connects before its restore says where to start).
    """
    index = worker_id
    cursor = -1
    try:
        start_cursor = _connect(stop, start_at, parent_pid, startup_latency_s)
        if start_cursor is None:
            out.cancel_join_thread()
            return 0
        cursor = start_cursor + index * world_size * spec.batch_size
        while True:
            cursor = start_cursor + index * world_size * spec.batch_size
            if fail_at is not None and cursor + world_size * spec.batch_size > fail_at:
                raise RuntimeError(f"injected failure (inject_failure_at={fail_at})")
            message = _Made(index, spec.rank_batch(cursor, rank, world_size))
            while True:
                if stop.is_set() or os.getppid() != parent_pid:
                    out.cancel_join_thread()
                    return 0
                try:
                    out.put(message, timeout=_PUT_POLL_S)
                    break
                except queue.Full:
                    continue
            index += num_workers
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: leave quietly
        out.cancel_join_thread()
        return 0
    except BaseException:
        out.put(_Failed(index, cursor, traceback.format_exc()))
        out.close()
        out.join_thread()  # the consumer must get this message: flush it into the pipe
        return 1


def _connect(stop: _StopFlag, start_at: Synchronized[int], parent_pid: int,
             startup_latency_s: float
             ) -> int | None:
    """The worker's start-up: `startup_latency_s` standing in for a real pipeline's
    connection to remote storage (benchmarks only), then the start cursor once it is
    known. None: stopped (or orphaned) meanwhile."""
    if startup_latency_s > 0 and stop.sleep(startup_latency_s):
        return None
    while start_at.value < 0:
        if stop.sleep(_START_POLL_S) or os.getppid() != parent_pid:
            return None
    return int(start_at.value)


def _shutdown(
    stop: _StopFlag, procs: list[SpawnProcess], queues: list[MPQueue[_Message]],
    join_s: float
) -> None:
    """Stop workers: ask, wait up to `join_s`, then SIGTERM, then SIGKILL; always reap.

    A module-level function (not a method) so that `weakref.finalize` can run it at
    garbage collection or interpreter exit without keeping the pool alive.
    """
    stop.set()
    deadline = time.monotonic() + join_s
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.pid is not None and proc.is_alive():
            proc.kill()
            proc.join()
    for q in queues:
        q.cancel_join_thread()  # the consumer never put anything; do not wait on a feeder
        q.close()


class WorkerPool:
    """`num_workers` spawned processes producing RawBatches, handed out in cursor order.

    Each worker has its own bounded queue and makes every n-th batch, so the consumer
    reassembles the order by reading the queues round-robin. One shared queue would need
    a reorder buffer that grows without bound when one worker lags; per-worker queues keep
    memory bounded (about `prefetch` batches in all, plus one in progress per worker).
    """

    def __init__(
        self,
        spec: Source,
        *,
        start_cursor: int | None,
        num_workers: int,
        prefetch: int,
        rank: int,
        world_size: int,
        startup_latency_s: float = 0.0,
        inject_failure_at: int | None = None,
        join_timeout_s: float = 2.0,
    ) -> None:
        import multiprocessing

        self._spec = spec
        self._start_cursor = start_cursor
        self._n = num_workers
        self._world = world_size
        ctx = multiprocessing.get_context("spawn")
        per_worker = max(1, math.ceil(prefetch / num_workers))
        self._stop = _StopFlag(ctx)
        # -1: not known yet (`set_start_cursor` tells the workers, connected meanwhile)
        self._start_at: Synchronized[int] = ctx.Value(
            "q", -1 if start_cursor is None else start_cursor)
        self._queues: list[MPQueue[_Message]] = [
            ctx.Queue(maxsize=per_worker) for _ in range(num_workers)
        ]
        self._procs: list[SpawnProcess] = [
            ctx.Process(
                target=_worker_entry,
                name=f"ett-data-worker-{k}",
                args=(
                    _worker_main, spec, k, num_workers, self._start_at, rank, world_size,
                    self._queues[k], self._stop, os.getpid(), startup_latency_s,
                    inject_failure_at,
                ),
                daemon=True,  # multiprocessing's own exit hook terminates them too
            )
            for k in range(num_workers)
        ]
        self._next_index = 0
        self._error: RuntimeError | None = None  # sticky: a failed pipeline stays failed
        self._finalizer = weakref.finalize(
            self, _shutdown, self._stop, self._procs, self._queues, join_timeout_s
        )

    def start(self) -> None:
        """Launch the worker processes; returns without waiting for their imports."""
        for proc in self._procs:
            proc.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def set_start_cursor(self, cursor: int) -> None:
        """Where the workers start, for a pool created without (`start_cursor=None`)."""
        if self._start_cursor is not None:
            raise RuntimeError(f"start cursor already set ({self._start_cursor})")
        self._start_cursor = cursor
        self._start_at.value = cursor

    def _cursor_of(self, index: int) -> int:
        assert self._start_cursor is not None, "no start cursor yet"
        return self._start_cursor + index * self._world * self._spec.batch_size

    def get(self, timeout: float | None = None) -> RawBatch:
        """The next batch in order; RuntimeError if its worker failed or died, no hang.

        TimeoutError if `timeout` passes first (the batch is then still the next one).
        After a failure every later call raises the same error again.
        """
        if self._error is not None:
            raise self._error
        if self.closed:
            raise RuntimeError("data pipeline is closed")
        index = self._next_index
        message = self._wait_message(index, timeout)
        k = index % self._n
        if isinstance(message, _Failed):
            self._error = RuntimeError(
                f"data worker {k} (pid {self._procs[k].pid}) failed producing the batch at "
                f"cursor {message.cursor} (batch {message.number}):\n{message.traceback}"
            )
            raise self._error
        if message.number != index:  # cannot happen with one producer per queue; guard anyway
            raise RuntimeError(f"data worker {k} sent batch {message.number}, expected {index}")
        self._next_index += 1
        return message.batch

    def _wait_message(self, index: int, timeout: float | None) -> _Message:
        """The message for batch `index` from its worker's queue, polling so that a closed
        pipeline, a dead worker or the deadline ends the wait instead of a hang."""
        k = index % self._n
        proc, q = self._procs[k], self._queues[k]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _GET_POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            try:
                return q.get(timeout=max(0.0, wait))
            except queue.Empty:
                pass
            if self.closed:  # close() from another thread while we waited
                raise RuntimeError("data pipeline was closed while waiting for a batch")
            if not proc.is_alive():
                try:  # anything it put before dying is already in the pipe
                    return q.get(timeout=0.5)
                except queue.Empty:
                    self._error = RuntimeError(
                        f"data worker {k} (pid {proc.pid}) died with exit code {proc.exitcode} "
                        f"before producing the batch at cursor {self._cursor_of(index)}"
                    )
                    raise self._error from None
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"data worker {k} produced no batch for cursor {self._cursor_of(index)} "
                    f"within {timeout} s"
                )

    def close(self) -> None:
        """Stop and reap every worker (idempotent)."""
        self._finalizer()
