"""`CheckpointManager`: save, commit, retain and restore, orchestrating the package's parts.

A save stages the state (`staging`), then, on one background thread, writes it with a
plain `dcp.save` and commits it (`commit`): what `dcp.async_save` with a blocking stager
would do, but with the commit ordered after the write on the same thread and its errors
reported through one future. At most one save is in flight: a save while one is in flight
first waits for it, and that wait counts in its `blocking_s`. A restore first collects
the save in flight, then walks the step directories newest first (`restore`), the
coordinator judging each (`integrity`). Every collective goes over the checkpoint group
(`coord`); without torch.distributed (one process) DCP runs with `no_dist=True` and every
coordination step is local.

`extra` is per rank: the marker's `extra` is rank 0's (what discovery reads: cursor,
step), and when ranks saved different ones (their own RNG states, say) the marker also
lists them all and `restore` gives each rank its own, as long as the world size is the
same.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Literal, TypeVar

import torch.distributed as dist

from airflow_ett.trainer.checkpoint.commit import (
    Gathered,
    commit_step,
    describe_mine,
    latest_committed,
    remove_stale,
    retain,
    tmp_dir_name,
    write_step,
)
from airflow_ett.trainer.checkpoint.coord import _Coord, checkpoint_process_group
from airflow_ett.trainer.checkpoint.integrity import check_step_dir
from airflow_ett.trainer.checkpoint.marker import _step_of, step_dir_name
from airflow_ett.trainer.checkpoint.restore import Verdict, restore_newest
from airflow_ett.trainer.checkpoint.results import (
    CheckpointError,
    RestoreResult,
    SaveResult,
    StateDict,
)
from airflow_ett.trainer.checkpoint.staging import (
    StagingBreakdown,
    _account,
    _await_verdict,
    _PendingStaging,
    _Stager,
    _watch_exit,
)

log = logging.getLogger("airflow_ett.trainer.checkpoint")

_NO_DIST_WARNING = r"torch\.distributed is (disabled, )?unavailable or uninitialized"

T = TypeVar("T")


@dataclass
class _InFlight:
    step: int
    final: Path
    future: Future[SaveResult]


class CheckpointManager:
    """Save, commit, retain and restore DCP checkpoints under one directory.

    Construct it on every rank, after `init_process_group` when there is one (the
    constructor creates the checkpoint group, a collective). `save`, `wait`, `restore` and
    `close` are called from the training thread; `on_commit` is called from whichever
    thread commits (the background writer when async, the caller when synchronous) on
    every rank, once the checkpoint is durable and committed; an exception it raises is
    logged, never propagated.

    `keep_last`: committed checkpoints to keep (0 keeps all); older ones, and
    uncommitted step directories older than the newest commit, are deleted only after a
    newer commit succeeded. `verify`: "checksum" (default) re-reads every file at
    restore and compares CRC32s; "size" only compares sizes (for checkpoints too big to
    re-read on every restart). `reuse_staging_buffers`: keep the staging copy between
    saves (one extra copy of the state in host memory, for much cheaper stagings).

    `overlap_staging` (async only): `save()` returns once the staging copies are started
    on a staging thread, and the caller must call `wait_staged()` before anything modifies
    the saved state (the next training step: its forward when buffers or fused
    optimizers update there, else its optimizer step). Everything that collects a save
    (`save`, `wait`, `restore`, `broadcast` with a group, `close`) passes that barrier
    first. At the barrier every source tensor's version counter is compared with its value
    at `save()`: a source modified before the barrier (through torch's dispatcher) fails
    that save instead of committing a torn snapshot. A save commits only once the barrier
    is passed; if the program ends without passing it, the save does not commit.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        keep_last: int = 3,
        async_save: bool = True,
        process_group: dist.ProcessGroup | None = None,
        on_commit: Callable[[SaveResult], None] | None = None,
        verify: Literal["checksum", "size"] = "checksum",
        reuse_staging_buffers: bool = True,
        write_threads: int = 1,
        collective_timeout: timedelta = timedelta(minutes=10),
        overlap_staging: bool = False,
    ) -> None:
        if overlap_staging and not async_save:
            raise ValueError("overlap_staging=True needs async_save=True")
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        if verify not in ("checksum", "size"):
            raise ValueError(f"verify must be 'checksum' or 'size', got {verify!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.async_save = async_save
        self.on_commit = on_commit
        #: Held from the commit marker's write through `on_commit`: a process that must
        #: leave with a save in flight (`os._exit`, not waiting for it) takes it first, so
        #: that a checkpoint is either committed and reported or neither.
        self.commit_lock = threading.Lock()
        self.verify = verify
        self.write_threads = max(1, write_threads)
        self.overlap_staging = overlap_staging
        if overlap_staging:
            _watch_exit()
        if dist.is_available() and dist.is_initialized():
            group = process_group or checkpoint_process_group(collective_timeout)
        elif process_group is not None:
            raise ValueError("a process_group was given but torch.distributed is not initialized")
        else:
            group = None
        self._coord = _Coord(group)
        self._stager = _Stager(reuse=reuse_staging_buffers)
        self._lock = threading.Lock()
        self._inflight: _InFlight | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._staging: _PendingStaging | None = None
        self._staging_executor: ThreadPoolExecutor | None = None
        self._live_tmp: set[Path] = set()
        self._seq = 0
        self._closed = False
        _quiet_no_dist_warning()
        # One token per manager, agreed by all ranks: they must write into one directory.
        self._token = self._coord.broadcast(secrets.token_hex(4))
        if self._coord.is_coordinator:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
        if group is not None:
            self._coord.broadcast(None)  # the others wait until the directory exists
        else:
            self.directory.mkdir(parents=True, exist_ok=True)

    # -- public API --------------------------------------------------------------------

    def save(self, step: int, state: StateDict, extra: Mapping[str, object]) -> SaveResult:
        """Checkpoint `state` (a DCP state dict) as `step`, with `extra` in the marker.

        Async: waits for a save in flight (re-raising its failure, as `CheckpointError`),
        stages a copy, hands the write and commit to the background thread and returns
        with `total_s`/`bytes` None; `wait()` or `on_commit` give the final figures.
        Synchronous: returns once the checkpoint is committed. Every rank calls it.
        """
        t0 = time.perf_counter()
        if self._closed:
            raise CheckpointError("save() on a closed CheckpointManager")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        try:  # validate and freeze extra now: the caller may mutate it once we return
            extra_json = json.dumps(extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra must be JSON-serialisable: {exc}") from exc
        waited = time.perf_counter()
        self._collect_inflight(timeout=None)
        waited = time.perf_counter() - waited
        self._seq += 1
        tmp = self.directory / tmp_dir_name(step, self._token, self._seq)
        final = self.directory / step_dir_name(step)
        self._live_tmp.add(tmp)
        if not self.async_save:
            try:
                return self._write_and_commit(step, dict(state), tmp, extra_json, t0, None)
            finally:
                self._live_tmp.discard(tmp)
        try:
            staged, pending = self._stage(state)
        except BaseException:
            self._live_tmp.discard(tmp)
            raise
        blocking = time.perf_counter() - t0
        _account(self._stager.breakdown, waited, blocking)
        log.debug(
            "checkpoint step %d staged: %.1f MB in %.3fs", step, self._stager.bytes / 1e6, blocking
        )
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ett-checkpoint")
        future = self._executor.submit(
            self._background, step, staged, tmp, extra_json, t0, blocking, pending
        )
        with self._lock:
            self._inflight = _InFlight(step, final, future)
        return SaveResult(step=step, path=final, blocking_s=blocking, total_s=None, bytes=None)

    def wait_staged(self) -> float:
        """The staging barrier of `overlap_staging`: wait until the last save's copies
        have landed; returns the seconds waited (0 when none is pending). Call it before
        the state is next modified. A source modified since `save()` fails that save
        (logged here, raised by whatever collects it: the next `save`, `wait`...)."""
        pending, self._staging = self._staging, None
        if pending is None:
            return 0.0
        return pending.pass_barrier()

    @property
    def staging_pending(self) -> bool:
        """Whether `wait_staged()` has a barrier to pass (an overlapped save's copies)."""
        return self._staging is not None

    @property
    def last_staging(self) -> StagingBreakdown:
        """Where the last async save's blocking time went (complete once its staging
        barrier is passed, with `overlap_staging`)."""
        return self._stager.breakdown

    def _stage(self, state: StateDict) -> tuple[StateDict, _PendingStaging | None]:
        """The staged state dict; with `overlap_staging` its copies are still being made
        on the staging thread (the pending staging says when they are done)."""
        staged, copies = self._stager.prepare(state)
        breakdown = self._stager.breakdown
        if not self.overlap_staging:
            _Stager.copy(copies, breakdown)
            return staged, None
        breakdown.copy_on_caller = False
        if self._staging_executor is None:
            self._staging_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ett-staging"
            )
        future = self._staging_executor.submit(_Stager.copy, copies, breakdown)
        self._staging = _PendingStaging(copies, future, breakdown)
        return staged, self._staging

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        """Wait for the save in flight: its final result, or None when there is none.

        Raises `CheckpointError` if it failed (once; the slot is then free) and
        `TimeoutError` if it is still running after `timeout` seconds (it stays in flight).
        """
        return self._collect_inflight(timeout)

    @property
    def in_flight(self) -> bool:
        """Whether a save was begun and not yet collected (by `save`, `wait`, `broadcast`
        or `close`): the same on every rank, since only the training thread collects,
        at the same calls on each (whether its commit has finished may differ)."""
        with self._lock:
            return self._inflight is not None

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank, over the checkpoint group (as is without one): for
        a decision around a save that every rank must take alike (whether to leave after
        it). Collective: every rank calls it; `obj` must pickle.

        With a group it first waits for the save in flight, as `save` does (re-raising its
        failure): that save's background commit runs collectives on the same group, and
        two threads' collectives on one group would pair up differently on each rank."""
        if self._coord.group is not None:
            self._collect_inflight(timeout=None)
        return self._coord.broadcast(obj)

    def latest(self) -> Path | None:
        """The newest committed checkpoint (its marker present and readable).

        Cheap (no checksums): for discovery, e.g. to start the data pipeline at the saved
        cursor while the model is built. `restore` may still reject it and fall back.
        """
        return latest_committed(self.directory)

    def latest_step(self) -> int | None:
        """The step of `latest()`, e.g. to tell whether the current step is saved already."""
        latest = self.latest()
        return None if latest is None else _step_of(latest)

    def restore(self, state: StateDict) -> RestoreResult | None:
        """Load the newest valid checkpoint into `state` in place (DCP load); None if none.

        Every rank calls it. Invalid checkpoints are skipped (logged as warnings and
        listed in the result). Raises `CheckpointError` when a DCP load failed part-way
        and no older checkpoint could be loaded over it (the state may be half-loaded).
        """
        if self._closed:
            raise CheckpointError("restore() on a closed CheckpointManager")
        try:
            self._collect_inflight(timeout=None)
        except CheckpointError as exc:
            log.error("the save in flight failed before restore: %s", exc)
        return restore_newest(self._coord, self.directory, state, self._validate)

    def close(self) -> None:
        """Wait for the save in flight and stop the background thread; idempotent.

        Re-raises a failure of that last save (after shutting down)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._collect_inflight(timeout=None)
        finally:
            self.wait_staged()  # in case collecting was interrupted before it
            for executor in (self._executor, self._staging_executor):
                if executor is not None:
                    executor.shutdown(wait=True)
            self._executor = self._staging_executor = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- saving ------------------------------------------------------------------------

    def _collect_inflight(self, timeout: float | None) -> SaveResult | None:
        self.wait_staged()
        with self._lock:
            inflight = self._inflight
        if inflight is None:
            return None
        try:
            result = inflight.future.result(timeout=timeout)
        except BaseException as exc:
            if not inflight.future.done():  # timed out (or interrupted): still in flight
                if isinstance(exc, TimeoutError):
                    raise TimeoutError(
                        f"checkpoint step {inflight.step} still in flight after {timeout}s"
                    ) from None
                raise
            with self._lock:
                self._inflight = None
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"checkpoint step {inflight.step} failed: {exc}") from exc
        with self._lock:
            self._inflight = None
        return result

    def _background(
        self,
        step: int,
        staged: StateDict,
        tmp: Path,
        extra_json: str,
        t0: float,
        blocking: float,
        pending: _PendingStaging | None,
    ) -> SaveResult:
        try:
            if pending is not None:
                pending.future.result()  # the copies have landed: the staged state is whole
            return self._write_and_commit(step, staged, tmp, extra_json, t0, blocking, pending)
        except BaseException as exc:
            # Log it here too: nobody may call wait() for a while.
            log.error("checkpoint step %d failed in the background: %s", step, exc)
            raise
        finally:
            self._live_tmp.discard(tmp)

    def _write_and_commit(
        self,
        step: int,
        state: StateDict,
        tmp: Path,
        extra_json: str,
        t0: float,
        blocking: float | None,
        pending: _PendingStaging | None = None,
    ) -> SaveResult:
        """DCP write of `state` into `tmp`, then commit. All ranks, same order of
        collectives: DCP's own (it raises on every rank when any rank fails), one gather
        of file checksums (or why this rank cannot commit), one broadcast of the
        coordinator's outcome. With an overlapped staging, the commit waits for the
        caller's barrier verdict, and the blocking time includes the barrier's wait."""
        coord = self._coord
        write_step(coord, step, state, tmp, self.write_threads)
        mine = describe_mine(coord, tmp)
        if pending is not None:
            error = _await_verdict(pending)
            if error is not None:
                mine = f"rank {coord.rank}: {error}"
            assert blocking is not None
            blocking += pending.breakdown.barrier_s
        gathered = coord.gather((mine, extra_json))
        with self.commit_lock:  # the commit and its report, as one (see `commit_lock`)
            outcome = self._commit_outcome(step, tmp, gathered, extra_json, t0, blocking)
            error, size, total = coord.broadcast(outcome)
            if error is not None:
                raise CheckpointError(f"checkpoint step {step}: commit failed: {error}")
            if not coord.is_coordinator or total is None:
                total = time.perf_counter() - t0
            result = SaveResult(
                step=step,
                path=self.directory / step_dir_name(step),
                blocking_s=blocking if blocking is not None else total,
                total_s=total,
                bytes=size,
            )
            if coord.is_coordinator:
                retain(self.directory, self.keep_last, self._live_tmp)
            if self.on_commit is not None:
                try:
                    self.on_commit(result)
                except Exception:
                    log.exception("on_commit callback failed for checkpoint step %d", step)
        return result

    def _commit_outcome(
        self,
        step: int,
        tmp: Path,
        gathered: Gathered,
        extra_json: str,
        t0: float,
        blocking: float | None,
    ) -> tuple[str | None, int, float | None]:
        """(error, bytes, total seconds) of the coordinator's commit, to broadcast; never
        raises, so no rank is left waiting. Other ranks contribute a placeholder."""
        if not self._coord.is_coordinator:
            return (None, 0, None)
        try:
            size, total = commit_step(
                self.directory, self._token, self._coord.size, step, tmp, gathered, extra_json,
                t0, blocking,
            )
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return (f"{type(exc).__name__}: {exc}", 0, None)
        return (None, size, total)

    def _remove_stale(self) -> None:
        """Coordinator: remove the temp directories crashed saves left (`remove_stale`)."""
        remove_stale(self.directory, self._live_tmp)

    # -- restoring ---------------------------------------------------------------------

    def _validate(self, path: Path) -> Verdict:
        """(reason it is invalid, None) or (None, marker). Never raises: on several ranks
        the others are waiting for the coordinator's verdict."""
        try:
            return self._check(path)
        except Exception as exc:
            return f"cannot validate: {type(exc).__name__}: {exc}", None

    def _check(self, path: Path) -> Verdict:
        return check_step_dir(path, self.verify)


def _quiet_no_dist_warning() -> None:
    """DCP warns on every single-process save and load that it assumes one process; we
    pass `no_dist=True` on purpose. Registered (idempotently) once per manager, because the
    warning is issued from the background thread, where `catch_warnings` would race."""
    warnings.filterwarnings("ignore", message=_NO_DIST_WARNING, category=UserWarning)
