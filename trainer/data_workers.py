"""The data workers: `WorkerPool`, spawned processes making a source's batches in order.

Worker `k` of `n` makes batches k, k+n, k+2n, ... of the pool's sequence from the start
cursor (each a pure function of its cursor: `data_source.Source.rank_batch`) and puts
them on a bounded queue of its own; the consumer reads the queues round-robin, so the
order is the cursor's and memory stays bounded (about `prefetch` batches in all) even
when one worker lags. Each message has one writer (`_worker_main`) and one reader
(`WorkerPool.get`): `_Made` (a batch) or `_Failed` (the traceback, the worker's last).

Promises: no hang (a failed or dead worker is a RuntimeError naming it and the cursor,
sticky; `get` polls, and `close` asks, then terminates, then kills, and always reaps);
no orphans (a worker whose parent died stops on its own); no leak (`weakref.finalize`
shuts the pool down at garbage collection or exit). Workers are *spawned*, never forked
(torch's threads in the parent), and import numpy and the standard library only, plus
what their source needs (`data_gen`, `files`: never torch). A pool may start before its
start cursor is known (a warm standby's pipeline connects before its restore says where
to start: `set_start_cursor`).
"""

from __future__ import annotations

import math
import os
import queue
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.queues import Queue as MPQueue
from multiprocessing.sharedctypes import Synchronized
from typing import NamedTuple, ParamSpec

from airflow_ett.trainer.data_source import RawBatch, Source

__all__ = ["WorkerPool"]

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
