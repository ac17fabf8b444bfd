"""Training data: a deterministic, resumable synthetic click log, and the fast batch.

Why it is built this way:

- **Resumable by construction.** Sample `i` depends only on `(seed, i)` (counter-based
  hashing, see `data_gen`), so the data cursor -- the index of the next sample -- is the
  whole pipeline state a checkpoint needs, and a pipeline started at cursor `c` yields
  bitwise the samples a pipeline started at 0 yields from `c` on, whatever the number of
  workers.
- **Fixed shapes.** Every sample has exactly `ids_per_feature` ids per feature, so every
  batch has the same shapes and dtypes and a compiled model never recompiles for the data.
- **Startup off the critical path.** `DataPipeline.start()` spawns its workers and returns
  at once; `fast_batch()` has the real shapes and dtypes without any pipeline, so the
  model can compile while the pipeline is still starting (DESIGN: "fast batch").
- **Multi-rank.** The cursor is global: with `world_size` W and per-rank batch B, step k
  covers samples `[c, c + W*B)` and rank r reads rows `[c + r*B, c + (r+1)*B)`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self

import numpy as np
import numpy.typing as npt
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from airflow_ett.trainer.data_gen import ClickLogSpec
from airflow_ett.trainer.data_source import RawBatch, Source, check_cursor, check_rank
from airflow_ett.trainer.data_workers import WorkerPool

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch as TorchRecBatch

__all__ = ["Batch", "ClickLogSpec", "DataPipeline", "fast_batch", "make_batch"]

FAST_BATCH_CURSOR = -1
"""cursor_start/cursor_end of a fast batch: never data, never progress."""


@dataclass
class Batch:
    """One rank's training batch and the global cursor range of its step.

    `sparse` is a KeyedJaggedTensor keyed by the source's feature names (int64 values,
    int32 lengths). `cursor_start`/`cursor_end` are `FAST_BATCH_CURSOR` (-1) for a fast
    batch. `skipped`/`problems`: this rank's bad rows of the range (`RawBatch`).
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    labels: torch.Tensor
    cursor_start: int
    cursor_end: int
    skipped: int = 0
    problems: tuple[str, ...] = ()

    def model_input(self) -> TorchRecBatch:
        """What the model contract's `module(batch)` gets: TorchRec's own `Batch`
        (`dense_features`, `sparse_features`, `labels`), the same tensors, no copy."""
        from torchrec.datasets.utils import Batch as TorchRecBatch

        return TorchRecBatch(dense_features=self.dense, sparse_features=self.sparse,
                             labels=self.labels)

    @property
    def is_fast(self) -> bool:
        """True for `fast_batch()`'s output: shape-only, must never count as progress."""
        return self.cursor_start == FAST_BATCH_CURSOR

    @property
    def num_rows(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        """Copy to `device`; host-to-device copies are non-blocking (they overlap compute
        when the batch was pinned with `pin_memory()`; device-to-host stays blocking, which
        is the only safe way without an explicit synchronisation)."""
        dev = torch.device(device)
        non_blocking = dev.type != "cpu"
        return Batch(
            dense=self.dense.to(dev, non_blocking=non_blocking),
            sparse=self.sparse.to(dev, non_blocking=non_blocking),
            labels=self.labels.to(dev, non_blocking=non_blocking),
            cursor_start=self.cursor_start,
            cursor_end=self.cursor_end,
            skipped=self.skipped,
            problems=self.problems,
        )

    def pin_memory(self) -> Batch:
        """Page-locked copy, so `to("cuda")` really overlaps; a no-op without CUDA."""
        if not torch.cuda.is_available():
            return self
        return Batch(
            dense=self.dense.pin_memory(),
            sparse=self.sparse.pin_memory(),
            labels=self.labels.pin_memory(),
            cursor_start=self.cursor_start,
            cursor_end=self.cursor_end,
            skipped=self.skipped,
            problems=self.problems,
        )


def _tensor(array: npt.NDArray[np.generic]) -> torch.Tensor:
    """Zero-copy when possible (arrays we made are writeable and contiguous)."""
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(np.ascontiguousarray(array))


def _build(source: Source, raw: RawBatch) -> Batch:
    """The single place batches are assembled, so real and fast batches cannot differ in
    dtype or KJT layout."""
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=source.feature_names, values=_tensor(raw.values), lengths=_tensor(raw.lengths)
    )
    return Batch(
        dense=_tensor(raw.dense),
        sparse=sparse,
        labels=_tensor(raw.labels),
        cursor_start=raw.cursor_start,
        cursor_end=raw.cursor_end,
        skipped=raw.skipped,
        problems=raw.problems,
    )


def make_batch(source: Source, cursor: int, *, rank: int = 0, world_size: int = 1) -> Batch:
    """The batch at global `cursor`, made inline (no workers), from a prepared source.

    With the defaults it holds samples `[cursor, cursor + batch_size)`. With `world_size`
    W it is rank `rank`'s share of the global batch `[cursor, cursor + W*B)`, and its
    cursor range is that global range.
    """
    return _build(source, source.rank_batch(cursor, rank, world_size))


def fast_batch(source: Source) -> Batch:
    """A batch with exactly the real shapes and dtypes, made from the schema alone.

    Cheap (constant fills) and independent of any file or worker, so compilation can
    start while the pipeline is still starting. Every feature has its `max_ids` ids per
    sample, all 0 (a valid row of every table); labels are 0. Its cursors are -1: it is
    not data. Use it to trace and compile, not to train: an optimizer step on it would
    change the weights.
    """
    b = source.batch_size
    lengths = np.repeat(np.asarray(source.max_ids, dtype=np.int32), b)
    return _build(source, RawBatch(
        cursor_start=FAST_BATCH_CURSOR,
        cursor_end=FAST_BATCH_CURSOR,
        dense=np.zeros((b, source.num_dense), dtype=np.float32),
        values=np.zeros(int(lengths.sum()), dtype=np.int64),
        lengths=lengths,
        labels=np.zeros((b,), dtype=np.float32),
    ))


class DataPipeline:
    """Batches in cursor order from background worker processes.

    `start()` returns at once; `wait_ready()` blocks until the first batch is in hand;
    iterating yields batches forever (the loop decides when to stop) with
    `cursor_start = start_cursor + k * world_size * batch_size`. `cursor()` is the global
    cursor after the last batch handed out -- what a checkpoint stores, provided the loop
    has trained on every batch it took (a loop that prefetches should store the
    `cursor_end` of the last batch it trained on instead).

    `num_workers=0` generates inline in the consumer (tests, tiny runs). Workers are
    spawned, never forked (torch's threads and torchrun make fork unsafe); they import
    only numpy (see `data_workers`), so their start is short. Note that spawn re-imports the
    parent's main *script* in each worker when the trainer is started as `python file.py`
    (not with `-m`), which then costs whatever that script imports.

    `startup_latency_s` adds a wait inside each worker before its first batch, standing in
    for a real pipeline's connection to remote storage; benchmarks use it to show the
    data-init/compile overlap at realistic proportions. `inject_failure_at` makes the
    worker that reaches that global sample raise (fault-injection for tests).

    `close()` stops workers promptly (join with a timeout, then SIGTERM, then SIGKILL) and
    is idempotent; it also runs when the pipeline is garbage-collected or the interpreter
    exits, and workers exit by themselves if their parent process dies.
    """

    def __init__(
        self,
        spec: Source,
        start_cursor: int | None = 0,
        num_workers: int = 1,
        prefetch: int = 4,
        rank: int = 0,
        world_size: int = 1,
        *,
        startup_latency_s: float = 0.0,
        inject_failure_at: int | None = None,
    ) -> None:
        self._spec = spec
        self._start_cursor = (None if start_cursor is None
                              else check_cursor(start_cursor, "start_cursor"))
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        check_rank(rank, world_size)
        if not startup_latency_s >= 0:  # also rejects NaN
            raise ValueError(f"startup_latency_s must be >= 0, got {startup_latency_s!r}")
        if inject_failure_at is not None:
            check_cursor(inject_failure_at, "inject_failure_at")
        self._num_workers = num_workers
        self._rank = rank
        self._world_size = world_size
        self._startup_latency_s = float(startup_latency_s)
        self._inject_failure_at = inject_failure_at
        self._step = spec.batch_size * world_size
        self._cursor = self._start_cursor or 0
        self._next_cursor = self._cursor  # inline mode: the batch to generate next
        self._prefetch = prefetch
        self._pool: WorkerPool | None = None  # made by `start`, once the source is prepared
        self._lock = threading.Lock()
        self._pending: Batch | None = None  # fetched by wait_ready, not yet handed out
        self._started_at: float | None = None
        self._first_batch_s: float | None = None
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the workers and return at once (idempotent)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("data pipeline is closed")
            if self._started:
                return
            self._started = True
            self._started_at = time.monotonic()
            # files are indexed (and their schema checked) once, here; workers share it
            self._spec = self._spec.prepare()
            if self._num_workers > 0:
                self._pool = WorkerPool(
                    self._spec,
                    start_cursor=self._start_cursor,
                    num_workers=self._num_workers,
                    prefetch=self._prefetch,
                    rank=self._rank,
                    world_size=self._world_size,
                    startup_latency_s=self._startup_latency_s,
                    inject_failure_at=self._inject_failure_at,
                )
                self._pool.start()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the first batch is in hand (starting the pipeline if needed).

        Raises TimeoutError after `timeout` seconds, RuntimeError (naming the worker and
        the cursor) if a worker failed or died. Safe to call from another thread than the
        one iterating, e.g. a parallel-init thread.
        """
        self.start()
        with self._lock:
            if self._pending is None and self._first_batch_s is None:
                self._pending = self._fetch(timeout)

    def close(self) -> None:
        """Stop and reap the workers; idempotent."""
        self._closed = True
        self._pending = None
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- data

    def next_batch(self, timeout: float | None = None) -> Batch:
        """The next batch in cursor order (blocking); advances `cursor()`."""
        self.start()
        with self._lock:
            if self._closed:
                raise RuntimeError("data pipeline is closed")
            batch, self._pending = self._pending, None
            if batch is None:
                batch = self._fetch(timeout)
            self._cursor = batch.cursor_end
            return batch

    def __iter__(self) -> Iterator[Batch]:
        """Batches forever; stop by breaking out (then `close()`, or use `with`)."""
        while True:
            yield self.next_batch()

    def cursor(self) -> int:
        """The global cursor after the last batch handed out (start_cursor before any)."""
        return self._cursor

    @property
    def start_cursor(self) -> int | None:
        return self._start_cursor

    def set_start_cursor(self, cursor: int) -> None:
        """Where a pipeline created with `start_cursor=None` starts. It may have been
        started (connected: its workers' start-up paid) before: a warm spare's pipeline
        connects while the spare waits, and learns its cursor from the restore."""
        check_cursor(cursor, "start_cursor")
        with self._lock:
            if self._start_cursor is not None:
                raise RuntimeError(f"start cursor already set ({self._start_cursor})")
            self._start_cursor = self._cursor = self._next_cursor = cursor
            if self._pool is not None:
                self._pool.set_start_cursor(cursor)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the workers (empty inline); for tests and diagnostics."""
        return [] if self._pool is None else self._pool.pids

    @property
    def first_batch_s(self) -> float | None:
        """Seconds from `start()` to the first batch in hand: the pipeline's init time."""
        return self._first_batch_s

    def _fetch(self, timeout: float | None) -> Batch:
        if self._closed:
            raise RuntimeError("data pipeline is closed")
        if self._start_cursor is None:
            raise RuntimeError("data pipeline has no start cursor yet (set_start_cursor)")
        if self._pool is not None:
            batch = _build(self._spec, self._pool.get(timeout))
        else:
            cursor = self._next_cursor
            if self._first_batch_s is None and self._startup_latency_s > 0:
                # the connection has been opening since start() (a warm spare's, early)
                assert self._started_at is not None
                time.sleep(max(0.0, self._startup_latency_s
                               - (time.monotonic() - self._started_at)))
            fail_at = self._inject_failure_at
            if fail_at is not None and cursor + self._step > fail_at:
                raise RuntimeError(
                    f"inline data generator failed producing the batch at cursor {cursor}: "
                    f"injected failure (inject_failure_at={fail_at})"
                )
            batch = make_batch(self._spec, cursor, rank=self._rank, world_size=self._world_size)
            self._next_cursor = cursor + self._step
        if self._first_batch_s is None and self._started_at is not None:
            self._first_batch_s = time.monotonic() - self._started_at
        return batch
