"""One attempt of a training job, from process start to exit, with every phase reported.

The start-up is a small dependency graph, run in parallel when `parallel_init` is on:

    checkpoint discovery (cheap: which checkpoint, which data cursor)
      |-> data pipeline start at that cursor ............................ (thread)
      |-> model creation -> checkpoint restore -> compile on the fast batch (main thread)
    then: wait for the first real batch, train.

Without `fast_batch`, compilation waits for the first real batch (the baseline the
source work measured); without `parallel_init`, everything runs one after the other.
Every rank reports its own phases and its attempt's start and end, tagged with its rank;
rank 0 alone reports progress and checkpoints, which are the job's (`Emitter(rank=...)`;
docs/decisions/0017-multi-rank.md).

Leaving when asked (preemption, `airflow_ett/protocol/request.py`): SIGTERM makes the
attempt finish its step, save (unless the current step is saved already) and exit 75
within the grace; when the pending request says `skip_save` (its save would not fit the
grace) it exits 75 at once, saving nothing. An `at_checkpoint` request in the job
directory (`$ETT_JOB_DIR`) is looked for at each periodic save, one small file read and
rename (the claim) by rank 0, its verdict broadcast so every rank leaves alike: once that
save has committed the attempt exits 75 too, saving nothing more. Nothing is read
between saves.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TextIO

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.protocol.env import FIRST_STEP_FILE_ENV, JOB_DIR_ENV
from airflow_ett.protocol.exits import (
    EXIT_APPLICATION,
    EXIT_BAD_CONFIG,
    EXIT_HUNG,
    EXIT_OK,
    EXIT_PREEMPTED,
    exit_record,
)
from airflow_ett.protocol.leave import (
    PreemptionFlag,
    preempted_message,
    signal_first_step,
)
from airflow_ett.trainer.checkpoint_interval import IntervalPolicy
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.contract import ModelContractError, warm_compile
from airflow_ett.trainer.faults import FaultInjector
from airflow_ett.trainer.model import build_for, shard, single_process
from airflow_ett.trainer.state import TrainState, rng_state, set_rng_state
from airflow_ett.trainer.watchdog import HangWatchdog

if TYPE_CHECKING:  # imported where used: torchrec (data) and inductor (cache) load late
    from airflow_ett.protocol.request import PreemptRequest
    from airflow_ett.trainer.checkpoint import CheckpointManager, SaveResult
    from airflow_ett.trainer.compile_cache import CompileCache
    from airflow_ett.trainer.data import Batch, DataPipeline
    from airflow_ett.trainer.data_gen import Source
    from airflow_ett.trainer.standby import PhaseRecorder

log = logging.getLogger("airflow_ett.trainer")


class Phases(Protocol):
    """Where a start-up step's phase goes: the emitter, or a warm spare's recorder
    (`trainer/standby.py`), which reports it only once the spare is the attempt."""

    def phase(self, name: str, component: Any = None) -> AbstractContextManager[str]: ...

@dataclass(frozen=True, slots=True)
class Identity:
    job_id: str
    attempt_id: str
    attempt_number: int


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_reporter(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> DistEnv:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        return cls(rank, world, local, device)


#: When the next checkpoint save is expected to begin: (steps done, now, seconds a step
#: lately or None) -> Unix seconds or None (`IntervalPolicy.next_save_ts`).
Schedule = Callable[[int, float, float | None], float | None]


@dataclass(slots=True)
class Progress:
    """Aggregates steps into progress spans of about a second, so a fast loop does not
    send an event per step; flushed before checkpoints, faults and at the end. Each span
    carries `schedule`'s answer as of its end (`next_save_ts`), the span's own steps
    giving the step rate."""

    emitter: Emitter
    schedule: Schedule | None = None
    span_s: float = 1.0
    start_ts: float | None = None
    step_start: int = 0
    step_end: int = 0
    cursor_start: int = 0
    cursor_end: int = 0
    loss: float | None = None

    def add(
        self,
        step: int,
        cursor_start: int,
        cursor_end: int,
        t0: float,
        t1: float,
        loss: float | None,
    ) -> None:
        if self.start_ts is None:
            self.start_ts, self.step_start, self.cursor_start = t0, step - 1, cursor_start
        self.step_end, self.cursor_end, self.loss = step, cursor_end, loss
        if t1 - self.start_ts >= self.span_s:
            self.flush(t1)

    def flush(self, end_ts: float | None = None) -> None:
        if self.start_ts is None:
            return
        end = time.time() if end_ts is None else end_ts
        steps = self.step_end - self.step_start
        step_s = max(0.0, end - self.start_ts) / steps if steps > 0 else None
        self.emitter.progress(
            self.step_start,
            self.step_end,
            self.cursor_start,
            self.cursor_end,
            self.start_ts,
            end,
            loss=self.loss,
            next_save_ts=(self.schedule(self.step_end, end, step_s)
                          if self.schedule is not None else None),
        )
        self.start_ts = None


@dataclass(slots=True)
class StepLogger:
    """The `step n/N  loss  samples/s  ETA` line, about every `every_s` and at the last
    step; rate and ETA are over the steps since the previous line."""

    total_steps: int
    samples_per_step: int
    every_s: float
    since: float = field(default_factory=time.time)
    steps: int = 0  # finished since `since`

    def step_done(self, step: int, loss: float, now: float) -> None:
        self.steps += 1
        if now - self.since < self.every_s and step != self.total_steps:
            return
        elapsed = now - self.since
        rate = self.steps * self.samples_per_step / max(elapsed, 1e-9)
        eta = (self.total_steps - step) * elapsed / max(self.steps, 1)
        log.info("step %d/%d  loss %.4f  %.0f samples/s  ETA %.0fs",
                 step, self.total_steps, loss, rate, eta)
        self.since, self.steps = now, 0


@dataclass(slots=True)
class Trainer:
    cfg: TrainerConfig
    ident: Identity
    env: DistEnv
    emitter: Emitter
    process_start: float
    preemption: PreemptionFlag = field(default_factory=PreemptionFlag)
    # model: set by `_build_model`; manager and pipeline: by `start` (unset before)
    model: torch.nn.Module = field(init=False, repr=False)
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    manager: CheckpointManager = field(init=False, repr=False)
    pipeline: DataPipeline = field(init=False, repr=False)
    step: int = 0
    cursor: int = 0
    # data rows skipped by the whole job as of the last save or restore (checkpointed with
    # the cursor), and by this rank since then
    bad_rows: int = 0
    bad_rows_here: int = 0
    compile_names: tuple[str, ...] = ()  # the model's parts to compile (the contract's)
    # per step being saved: (save start time, final save?, data cursor), until committed
    saves_in_flight: dict[int, tuple[float, bool, int]] = field(default_factory=dict)
    # the step of the latest save begun (committed once `manager.wait` returns)
    last_save_step: int | None = None
    # the `at_checkpoint` request this attempt left on, after its periodic save
    left_for: PreemptRequest | None = None
    _cache_to_save: CompileCache | None = None  # the cache missed: save after the first step
    _cache_saver: threading.Thread | None = None
    _faults: FaultInjector | None = None  # set by `train`: a slow_save acts in `save`
    _warmed: bool = False  # a warm spare: model built and compiled before it was needed

    # -- start-up ------------------------------------------------------------------------

    def _source(self) -> Source:
        """Where the batches come from: the generated log or the owner's files."""
        cfg = self.cfg
        if cfg.data.is_files:
            from airflow_ett.trainer.files import file_source

            return file_source(cfg.data, cfg.batch_size)
        from airflow_ett.trainer.data_gen import ClickLogSpec

        schema = cfg.data.schema
        return ClickLogSpec(seed=cfg.seed, num_dense=schema.num_dense, tables=schema.tables,
                            ids_per_feature=cfg.data.ids_per_feature,
                            batch_size=cfg.batch_size)

    def _data_pipeline(self, start_cursor: int | None) -> DataPipeline:
        """This rank's pipeline from `start_cursor` (created, not started; None: a cursor
        set later, `DataPipeline.set_start_cursor`)."""
        from airflow_ett.trainer.data import DataPipeline

        cfg = self.cfg
        return DataPipeline(
            self._source(),
            start_cursor=start_cursor,
            num_workers=cfg.num_workers,
            prefetch=cfg.prefetch,
            rank=self.env.rank,
            world_size=self.env.world_size,
            startup_latency_s=cfg.data_startup_latency_s,
        )

    def _start_pipeline(self) -> None:
        with self.emitter.phase("data_pipeline_init"):
            self.pipeline.start()
            self.pipeline.wait_ready()

    def _checkpoint_manager(self) -> CheckpointManager:
        from airflow_ett.trainer.checkpoint import CheckpointManager

        cfg = self.cfg
        return CheckpointManager(
            cfg.checkpoint_dir,
            keep_last=cfg.keep_last,
            async_save=cfg.optimizations.async_checkpoint,
            # the staging copy runs while the loop goes on to the next batch; `_step`
            # waits for it before the forward (the first use that may modify the state)
            overlap_staging=cfg.optimizations.async_checkpoint,
            on_commit=self._on_commit,
            interval=IntervalPolicy.from_config(cfg, lambda: _history(cfg, self.ident.job_id)),
        )

    def _discover(self) -> dict[str, Any] | None:
        """The newest committed checkpoint's `extra` (cursor, step), without loading it:
        the data pipeline can start at the right cursor while the model is built."""
        latest = self.manager.latest()
        if latest is None:
            return None
        from airflow_ett.trainer.checkpoint import read_marker

        try:
            return dict(read_marker(Path(latest))["extra"])
        except (OSError, ValueError) as exc:
            log.warning("checkpoint %s: cannot read its marker (%s); restore decides", latest, exc)
            return None

    def _build_model(self) -> None:
        """The owner's model through the contract; sharded with more than one process."""
        cfg, env = self.cfg, self.env
        built = build_for(cfg, device=env.device, world_size=env.world_size)
        self.compile_names = tuple(built.compile)
        if env.world_size == 1:
            self.model, self.optimizers = single_process(cfg, built)
        else:
            self.model, self.optimizers = shard(cfg, built, env.device)

    def _train_state(self) -> TrainState:
        return TrainState(self.model, self.optimizers, sharded=self.env.world_size > 1)

    def _restore(self) -> dict[str, Any] | None:
        result = self.manager.restore({"train": self._train_state()})
        if result is None:
            return None
        for path, reason in result.skipped:
            log.warning("checkpoint %s skipped: %s", path, reason)
        extra = dict(result.extra)
        if "rng" in extra:
            set_rng_state(extra["rng"])
        log.info(
            "restored step %d (cursor %d) from %s",
            extra.get("step", result.step),
            extra.get("cursor", 0),
            result.path,
        )
        return extra

    def _compile_on(self, batch: Batch) -> None:
        """Compile the model's named parts by running it forward and backward on `batch`
        with the tables detached: no parameter is updated (the tables' fused optimizer
        would step in backward), yet the graphs are exactly those training will run."""
        warm_compile(self.model, self.compile_names, batch.model_input())

    def _compile_cache(self) -> CompileCache | None:
        if not (
            self.cfg.compile and self.cfg.optimizations.compile_cache and self.cfg.compile_cache_dir
        ):
            return None
        from airflow_ett.trainer.compile_cache import CompileCache

        return CompileCache(self.cfg.compile_cache_dir)

    def cache_key(self, world_size: int | None = None) -> str:
        """`world_size`: the job's, when a one-process prewarm compiles for a larger job."""
        from airflow_ett.trainer.compile_cache import device_kind, trainer_cache_key

        return trainer_cache_key(
            self.cfg.cache_identity(), device_kind(self.env.device),
            batch_size=self.cfg.batch_size, world_size=world_size or self.env.world_size,
        )

    def _compile(self, batch: Batch, cache: CompileCache | None,
                 phases: Phases | None = None) -> bool:
        """Compile (through the cache when there is one); True when the cache missed and
        should be saved once backward has run. Phases go to `phases` (the emitter)."""
        em = phases if phases is not None else self.emitter
        missed = False
        with em.phase("compile"):
            if cache is not None:
                with em.phase("cache_load"):
                    load = cache.activate(self.cache_key())
                missed = not load.hit
                log.info(
                    "compile cache %s (%s)", "hit" if load.hit else "miss", load.reason or "ok"
                )
            self._compile_on(batch)
        # a hit whose forwards could not all be loaded compiled them here: save those too,
        # or every later start compiles them again
        return missed or (cache is not None and cache.needs_save())

    def warm_up(self, phases: PhaseRecorder) -> None:
        """A warm spare's part of the start, before it is an attempt (nothing reported:
        `phases` records): the model built and compiled on the fast batch through the
        compile cache, and the data pipeline connected (its workers started, waiting to
        be told the cursor: the restore says it). `start` then restores, gives the
        pipeline its cursor and skips the rest."""
        from airflow_ett.trainer.data import fast_batch

        self.pipeline = self._data_pipeline(None)
        self.pipeline.start()
        with phases.phase("model_creation"):
            self._build_model()
        cache = self._compile_cache()
        if self.cfg.compile and self._compile(
                fast_batch(self._source()).to(self.env.device), cache, phases):
            self._cache_to_save = cache
        self._warmed = True

    def start(self) -> Iterator[Batch]:
        """Everything up to the first real batch; returns the batch iterator."""
        cfg, em = self.cfg, self.emitter
        trainer_init = None if self._warmed else em.phase_start(
            "trainer_init", ts=self.process_start)
        if self.env.world_size > 1 and not dist.is_initialized():
            with em.phase("process_group_init"):
                dist.init_process_group("nccl" if self.env.device.type == "cuda" else "gloo")
        self.manager = self._checkpoint_manager()
        resume = self._discover()
        if self._warmed:  # connected while the spare waited
            self.pipeline.set_start_cursor(int(resume["cursor"]) if resume else 0)
        else:
            self.pipeline = self._data_pipeline(int(resume["cursor"]) if resume else 0)
        if trainer_init is not None:
            em.phase_end("trainer_init", trainer_init)
        cache = None if self._warmed else self._compile_cache()
        missed = self._start_data_and_model(resume, cache)
        if self.pipeline.cursor() != self.cursor:
            # restore fell back to an older checkpoint than discovery saw
            log.warning(
                "restored cursor %d differs from the pipeline's %d: restarting it",
                self.cursor,
                self.pipeline.cursor(),
            )
            self.pipeline.close()
            self.pipeline = self._data_pipeline(self.cursor)
            self._start_pipeline()
        batches: Iterator[Batch] = iter(self.pipeline)
        if cfg.compile and not cfg.optimizations.fast_batch and not self._warmed:
            first = next(batches)
            missed.append(self._compile(first.to(self.env.device), cache))
            batches = _chain_first(first, batches)
        if cache is not None and any(missed):
            self._cache_to_save = cache
        return batches

    def _start_data_and_model(self, resume: dict[str, Any] | None,
                              cache: CompileCache | None) -> list[bool]:
        """Start the data pipeline while the model is built, restored and (with
        `fast_batch`) compiled: on a thread of its own with `parallel_init`, else first.
        Returns whether each compile run here missed the cache."""
        from airflow_ett.trainer.data import fast_batch

        cfg, em = self.cfg, self.emitter
        data_error: list[BaseException] = []
        missed: list[bool] = []

        def start_data() -> None:
            try:
                self._start_pipeline()
            except BaseException as exc:  # re-raised on the main thread
                data_error.append(exc)

        def build_restore_compile() -> None:
            if not self._warmed:
                with em.phase("model_creation"):
                    self._build_model()
            if resume is not None:
                with em.phase("checkpoint_restore"):
                    restored = self._restore()
                self._resume_from(restored)
            if cfg.compile and cfg.optimizations.fast_batch and not self._warmed:
                missed.append(self._compile(fast_batch(self._source()).to(self.env.device), cache))

        if cfg.optimizations.parallel_init:
            data_thread = threading.Thread(target=start_data, name="ett-data-init")
            data_thread.start()
            build_restore_compile()
            with em.phase("first_batch"):
                data_thread.join()
        else:
            start_data()
            build_restore_compile()
        if data_error:
            raise data_error[0]
        return missed

    def _resume_from(self, restored: dict[str, Any] | None) -> None:
        if restored is not None:
            self.step = int(restored["step"])
            self.cursor = int(restored["cursor"])
            self.bad_rows = int(restored.get("bad_rows", 0))

    # -- checkpoints ---------------------------------------------------------------------

    def _on_commit(self, result: SaveResult) -> None:
        started, final, cursor = self.saves_in_flight.pop(
            result.step, (time.time(), False, 0))
        self.emitter.checkpoint(
            result.step,
            cursor,
            started,
            result.blocking_s,
            result.total_s or 0.0,
            bytes=result.bytes or 0,
            final=final,
        )
        log.info(
            "checkpoint step %d committed: blocking %.3fs, total %.3fs, %s bytes",
            result.step,
            result.blocking_s,
            result.total_s or 0.0,
            result.bytes,
        )

    def save(self, *, final: bool = False) -> SaveResult:
        """Save this step. A save other than the final one (inside `final_checkpoint`) is
        reported as a `checkpoint_save_blocking` phase from its start: its
        `checkpoint_saved` comes only once it has committed, and the preemption
        controller must see a save in progress to leave the job alone (the attribution
        counts a save reported both ways once)."""
        if final:
            return self._save(final=True)
        with self.emitter.phase("checkpoint_save_blocking"):
            delay = self._faults.save_delay_s(self.step) if self._faults is not None else 0.0
            if delay:
                time.sleep(delay)
            return self._save(final=False)

    def _save(self, *, final: bool) -> SaveResult:
        self.saves_in_flight[self.step] = (time.time(), final, self.cursor)
        self.last_save_step = self.step
        extra = {
            "step": self.step,
            "cursor": self.cursor,
            "rng": rng_state(),
            "model": self.cfg.model.name,
            # what preflight compares, so another model's job refuses this directory
            "model_identity": self.cfg.model_identity,
            "world_size": self.env.world_size,
            "bad_rows": self._job_bad_rows(),
        }
        return self.manager.save(self.step, {"train": self._train_state()}, extra)

    def _maybe_checkpoint(self, now: float, progress: Progress, beat: Callable[[], None]
                          ) -> bool:
        """The periodic save, when the interval policy says it is due (never at the last
        step: `finish` saves that one). True: leave now, this save committed, as an
        `at_checkpoint` preemption request asked."""
        if self.step >= self.cfg.steps or not self._save_due(now):
            return False
        progress.flush(now)
        request = self._checkpoint_request()  # before the save: see `manager.broadcast`
        result = self.save()
        beat()
        self.manager.interval.saved(self.step, time.time(), result.blocking_s)
        if request is None:
            return False
        self._leave_at_checkpoint(request)
        beat()
        return True

    def _save_due(self, now: float) -> bool:
        """Whether the periodic save is due, the same answer on every rank. A step
        interval gives it by itself: every rank counts the same steps. A time interval
        ("30s", "auto") does not: each rank reads its own clock against the end of its own
        last save (and under "auto" chooses the interval from its own blocking time), so
        near the boundary one rank would begin a save while another stepped on, and their
        collectives would pair wrongly or hang. With more than one rank, rank 0's answer
        goes to all: one scalar per step over the default group (never used by a
        background commit), after a step that has already waited for its loss."""
        interval = self.manager.interval
        due = interval.due(self.step, now)
        if (self.env.world_size == 1 or not dist.is_initialized() or interval.steps is not None
                or interval.seconds is None):
            return due
        flag = torch.tensor([1 if due else 0], dtype=torch.int32, device=self.env.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _checkpoint_request(self) -> PreemptRequest | None:
        """The pending `at_checkpoint` request, the same on every rank, looked for as a
        periodic save begins: rank 0 claims it (`request.claim_request`, a rename that
        either wins over a withdrawal or finds the request gone: then there is none), and
        only then does the checkpoint group carry the verdict, so no rank leaves on a
        request the controller took back. One made before this attempt started is not
        this attempt's: the train task puts it aside."""
        from airflow_ett.protocol.leave import claim_at_save
        from airflow_ett.protocol.request import parse_request

        found: str | None = None
        if self.env.is_reporter:
            request = claim_at_save(_job_dir(), since=self.process_start)
            if request is not None:
                found = request.to_json()
        found = self.manager.broadcast(found)
        return parse_request(found) if found is not None else None

    def _leave_at_checkpoint(self, request: PreemptRequest) -> None:
        """Wait for the save just begun to commit (by the request's `leave_by` + grace),
        then the attempt leaves on it; if it failed, save once more within the grace."""
        from airflow_ett.trainer.checkpoint import CheckpointError

        self.left_for = request
        log.warning("preemption at checkpoint step %d: leaving once it is committed (%s)",
                    self.step, request.reason)
        deadline = request.leave_by + request.grace_s
        try:
            self.manager.wait(timeout=max(0.0, deadline - time.time()))
            return
        except CheckpointError as exc:
            log.error("the checkpoint to leave on failed (%s): saving again", exc)
            self.last_save_step = None  # nothing holds this step
        except TimeoutError as exc:
            log.error("the checkpoint to leave on is not committed by the deadline: %s", exc)
            return
        self._leave_preempted(time.time() + request.grace_s)  # on the request all the same

    # -- the loop ------------------------------------------------------------------------

    def train(self, batches: Iterator[Batch]) -> int:
        cfg, em = self.cfg, self.emitter
        interval = self.manager.interval
        progress = Progress(em, lambda step, now, step_s: interval.next_save_ts(
            step, now, step_s, cfg.steps))
        self._faults = faults = FaultInjector(
            cfg.faults, self.ident.attempt_number, rank=self.env.rank,
            before_fault=progress.flush,
            before_kill=lambda: em.flush(1.0))
        self.manager.interval.start(self.step)
        watchdog = self._watchdog()
        steps = StepLogger(cfg.steps, cfg.batch_size * self.env.world_size, cfg.log_every_s)
        try:
            return self._loop(batches, progress, faults, steps,
                              watchdog.beat if watchdog is not None else _nothing)
        finally:
            if watchdog is not None:
                watchdog.stop()

    def _watchdog(self) -> HangWatchdog | None:
        timeout = self.cfg.hang_timeout_s
        if timeout is None:
            return None
        em = self.emitter

        def hung(last_beat: float, now: float) -> None:
            log.error("hang: no step finished for %.1f s (since step %d): leaving with exit "
                      "code %d so the launcher restarts the attempt", now - last_beat,
                      self.step, EXIT_HUNG)
            em.attempt_ended("failed", cause="infra", detected_ts=now, exit_code=EXIT_HUNG,
                             message=f"hung: no step finished for {timeout:g} s after step "
                                     f"{self.step}")
            exit_record.reported("infra")
            exit_record.failed(now, f"hung after step {self.step}")
            exit_record.exit(EXIT_HUNG)
            em.flush(min(2.0, timeout))
            os._exit(EXIT_HUNG)  # the main thread is stuck: no orderly way out

        return HangWatchdog(timeout, hung)

    def _loop(self, batches: Iterator[Batch], progress: Progress, faults: FaultInjector,
              steps: StepLogger, beat: Callable[[], None]) -> int:
        """Step, then: maybe checkpoint (and leave on it, if asked), maybe log, maybe
        fault, leave if SIGTERMed. The SIGTERM check comes last so that a step just saved
        periodically is not saved again to leave."""
        first_step = self.step
        while self.step < self.cfg.steps:
            loss, now = self._step(next(batches), progress)
            if self.step == first_step + 1:
                self._after_first_step()
            beat()
            if self._maybe_checkpoint(now, progress, beat):
                return EXIT_PREEMPTED
            steps.step_done(self.step, loss, now)
            faults.after_step(self.step, now)
            if self.preemption.requested:
                progress.flush(now)
                return self._leave_preempted()
        progress.flush()
        return EXIT_OK

    def _step(self, batch: Batch, progress: Progress) -> tuple[float, float]:
        """One training step on `batch`, recorded; returns (loss, when it ended)."""
        if batch.skipped:
            self._count_bad_rows(batch)
        batch = batch.to(self.env.device)
        if self.manager.staging_pending:  # the last save's copy lands before any update
            # No phase of its own: a `checkpoint_save_blocking` opened here would read as
            # a new save begun (scheduling/live.py). The wait is in the save's
            # `checkpoint_saved.blocking_s` (CSBT) and, in the timeline, wasted training.
            self.manager.wait_staged()
        t0 = time.time()
        loss = float(self._train_step(batch))
        if self.cfg.step_sleep_s:
            time.sleep(self.cfg.step_sleep_s)
        t1 = time.time()
        self.step += 1
        self.cursor = batch.cursor_end
        progress.add(self.step, batch.cursor_start, batch.cursor_end, t0, t1, loss)
        return loss, t1

    def _after_first_step(self) -> None:
        """Compilation is complete once backward ran: report it, and save a cache that
        missed (off the loop's critical path; `close` joins it so the entry is whole)."""
        if self.env.is_reporter:  # the launcher's cue for a spare
            signal_first_step(_env_path(FIRST_STEP_FILE_ENV))
        if self.cfg.compile:
            _log_compile_counters("after the first real step")
        cache, self._cache_to_save = self._cache_to_save, None
        if cache is not None and self.env.is_reporter:  # one rank saves: the same entry
            self._cache_saver = threading.Thread(
                target=_save_cache,
                args=(cache, self.cache_key()),
                name="ett-cache-save",
                daemon=True,
            )
            self._cache_saver.start()

    def _job_bad_rows(self) -> int:
        """The job's bad rows now: every rank's since the last save added up (one small
        collective per save, on the default group, which a background commit never
        uses; every rank saves at the same step), then kept as the new base."""
        here = self.bad_rows_here
        if self.env.world_size > 1 and dist.is_initialized():
            count = torch.tensor([here], dtype=torch.int64, device=self.env.device)
            dist.all_reduce(count)
            here = int(count.item())
        self.bad_rows, self.bad_rows_here = self.bad_rows + here, 0
        return self.bad_rows

    def _count_bad_rows(self, batch: Batch) -> None:
        """Bad rows of this batch against `data.max_bad_rows` (a job's count, kept in its
        checkpoints): each named in the log, and past the limit a `DataError` (each rank
        checks the job's count at the last save plus its own since)."""
        from airflow_ett.trainer.files import DataError

        self.bad_rows_here += batch.skipped
        for problem in batch.problems:
            log.warning("bad row skipped: %s", problem)
        if batch.skipped > len(batch.problems):
            log.warning("%d more bad rows skipped in the batch at cursor %d",
                        batch.skipped - len(batch.problems), batch.cursor_start)
        limit = self.cfg.data.max_bad_rows
        seen = self.bad_rows + self.bad_rows_here
        if seen > limit:
            last = batch.problems[-1] if batch.problems else "see the log"
            raise DataError(f"data: {seen} bad rows, more than max_bad_rows = {limit}"
                            f" (the last: {last})")

    def _train_step(self, batch: Batch) -> torch.Tensor:
        loss: torch.Tensor = self.model(batch.model_input())[0]
        torch.autograd.backward(loss)
        for opt in self.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def _leave_preempted(self, deadline: float | None = None) -> int:
        """Save the current step (unless it is saved already) by `deadline` (by default the
        grace after SIGTERM), then leave preempted. On SIGTERM, a pending request that says
        `skip_save` (its save would not fit the grace: the kill would cut it) makes the
        attempt leave at once instead, saving nothing and waiting for no save in flight:
        the GPUs are free now rather than at the end of the grace."""
        if deadline is None:
            unsaved = self._skip_save_request()
            if unsaved is not None:
                self.left_for = unsaved
                log.warning("preempted: leaving at step %d without saving, as asked (the "
                            "exit save would not fit the grace; the last checkpoint is "
                            "step %s): %s", self.step, self.manager.latest_step(),
                            unsaved.reason)
                return EXIT_PREEMPTED
            deadline = (self.preemption.received_at or time.time()) + self.cfg.grace_s
        try:
            if self._current_step_saved(deadline):
                log.info("preempted: step %d is checkpointed already: no exit save", self.step)
            else:
                self.save()
                self.manager.wait(timeout=max(0.0, deadline - time.time()))
        except Exception as exc:
            log.error("preempted: the checkpoint did not finish within the grace period: %s", exc)
        return EXIT_PREEMPTED

    def _skip_save_request(self) -> PreemptRequest | None:
        """The pending request when it says `skip_save`, the same on every rank: rank 0
        reads it (one small file read, on this path only) and every rank gets its verdict
        (`_agree_now`)."""
        from airflow_ett.protocol.leave import skip_save_request
        from airflow_ett.protocol.request import parse_request

        found: str | None = None
        if self.env.is_reporter:
            request = skip_save_request(_job_dir())
            if request is not None:
                found = request.to_json()
        found = self._agree_now(found)
        return parse_request(found) if found is not None else None

    def _agree_now(self, value: str | None) -> str | None:
        """Rank 0's `value` on every rank, without waiting for a save in flight:
        `manager.broadcast` waits for it under a group (that save's commit runs
        collectives on the checkpoint group), so with one in flight the verdict goes over
        the default group, which the background commit never uses. Whether one is in
        flight is the same on every rank (`CheckpointManager.in_flight`)."""
        if not (dist.is_initialized() and self.manager.in_flight):
            return self.manager.broadcast(value)
        box: list[Any] = [value]
        dist.broadcast_object_list(box, src=0, device=self.env.device)
        found: str | None = box[0]
        return found

    def _current_step_saved(self, deadline: float) -> bool:
        """Wait (by `deadline`) for the save in flight; True when the current step is in a
        committed checkpoint: saving it again would only cost the grace."""
        from airflow_ett.trainer.checkpoint import CheckpointError

        try:
            self.manager.wait(timeout=max(0.0, deadline - time.time()))
        except CheckpointError as exc:
            log.error("preempted: the checkpoint in flight failed (%s): saving again", exc)
            return False
        return self.last_save_step == self.step

    def finish(self) -> None:
        em = self.emitter
        with em.phase("final_checkpoint"):
            if self.manager.latest_step() != self.step:
                self.save(final=True)
            self.manager.wait()
        with em.phase("teardown"):
            self.close()

    def close(self) -> None:
        if self._cache_saver is not None:
            self._cache_saver.join(timeout=120)
        for part in (getattr(self, "pipeline", None), getattr(self, "manager", None)):
            if part is not None:
                try:
                    part.close()
                except Exception as exc:
                    log.warning("teardown: %s", exc)


def _train(trainer: Trainer, emitter: Emitter, warm_up: _WarmUp | None) -> int:
    """Start (a spare: report its warm-up first), train, finish; the attempt's end
    reported. Returns the exit code."""
    if warm_up is not None:
        warm_up.report(emitter)
    code = trainer.train(trainer.start())
    if code == EXIT_OK:
        trainer.finish()
        emitter.attempt_ended("success", exit_code=EXIT_OK)
        exit_record.reported(None)
        return code
    exit_record.failed(time.time())
    emitter.attempt_ended("failed", cause="preemption", exit_code=code,
                          message=_preempted_message(trainer.left_for))
    exit_record.reported("preemption")
    return code


def _refused(exc: Exception, ident: Identity, emitter: Emitter) -> int:
    """The owner's code or data refused (the contract, a bad file, too many bad rows):
    retrying will not change either, so one line and exit 78, as a bad config."""
    exit_record.failed(time.time(), str(exc))
    log.error("attempt %s: %s", ident.attempt_id, exc)
    exit_record.reported("application")
    emitter.attempt_ended("failed", cause="application", exit_code=EXIT_BAD_CONFIG,
                          message=str(exc)[:500])
    return EXIT_BAD_CONFIG


def _crashed(exc: BaseException, ident: Identity, emitter: Emitter) -> None:
    """Any other failure: the traceback in the log, the attempt failed (application)."""
    exit_record.failed(time.time(), f"{type(exc).__name__}: {exc}")
    log.exception("attempt %s failed", ident.attempt_id)
    exit_record.reported("application")
    emitter.attempt_ended("failed", cause="application", exit_code=EXIT_APPLICATION,
                          message=f"{type(exc).__name__}: {exc}"[:500])


def _data_error() -> type[Exception]:
    from airflow_ett.trainer.files import DataError

    return DataError


def _nothing() -> None:
    """No watchdog: nothing to tell."""


def _log_compile_counters(when: str) -> None:
    from airflow_ett.trainer.compile_cache import compile_counters, format_counters

    log.info("compile %s: %s", when, format_counters(compile_counters()))


def _chain_first(first: Batch, rest: Iterator[Batch]) -> Iterator[Batch]:
    yield first
    yield from rest


def _save_cache(cache: CompileCache, key: str) -> None:
    try:
        path = cache.save(key)
        log.info("compile cache saved: %s", path)
    except Exception as exc:
        log.warning("compile cache not saved: %s", exc)


def _history(cfg: TrainerConfig, job_id: str) -> tuple[float, int, float | None]:
    """(effective training seconds, failures, mean blocking per save) of this job so far,
    from its events file or the ETT store; zeros when neither can be read."""
    from airflow_ett.ett.attribution import attribute_job
    from airflow_ett.ett.summary import JobSummary

    try:
        summary: JobSummary
        if cfg.events_file is not None:
            from airflow_ett.ett.events import read_events

            events = [e for e in read_events(str(cfg.events_file)).events if e.job == job_id]
            if not events:
                return 0.0, 0, None
            summary = attribute_job(events).summary()
        else:
            from airflow_ett.store import EttStore

            with EttStore() as store:  # the [ett] store_url
                summary = store.job_summary(job_id)
    except Exception as exc:
        log.info("no failure history for %s (%s): assuming none", job_id, exc)
        return 0.0, 0, None
    return summary.effective_s, summary.failure_count, summary.blocking_per_save_s


def _preempted_message(left_for: PreemptRequest | None = None) -> str:
    """The `attempt_ended` message of a preempted attempt (`protocol.leave`)."""
    return preempted_message(left_for, _job_dir())


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _job_dir() -> Path | None:
    """The job directory the task gave (`$ETT_JOB_DIR`): where a request is left."""
    return _env_path(JOB_DIR_ENV)


def _rank_emitter(ident: Identity, env: DistEnv, sink: JsonlSink | None) -> Emitter:
    """This rank's emitter; `[ett] disabled` decides on every rank (None: read the
    setting). The host's spool holds other jobs' events, meant for the store: an attempt
    writing to its own events file must not replay them into it, and only rank 0 replays
    (one replayer per host and attempt)."""
    return Emitter(ident.job_id, ident.attempt_id, sink=sink, disabled=None,
                   replay_on_start=sink is None and env.is_reporter, rank=env.rank)


def run(cfg: TrainerConfig, ident: Identity, *, process_start: float, prewarm: bool = False,
        prewarm_world_size: int | None = None, standby: TextIO | None = None) -> int:
    """One attempt: returns the process exit code (see `faults.py`). With `standby` (the
    stream the launcher says go on), a warm spare: warm up, wait, then be the attempt
    from the go time on, or exit quietly when not needed (`trainer/standby.py`)."""
    env = DistEnv.from_environment()
    sink = JsonlSink(cfg.events_file) if cfg.events_file is not None else None
    emitter = _rank_emitter(ident, env, sink)
    if prewarm:
        return _prewarm(cfg, ident, env, emitter, prewarm_world_size)
    trainer = Trainer(cfg, ident, env, emitter, process_start)
    warm_up: _WarmUp | None = None
    if standby is not None:
        warm_up = _stand_by(trainer, standby)
        if warm_up is None:
            trainer.close()
            emitter.close()
            return EXIT_OK
        trainer.process_start = warm_up.go_ts
    trainer.preemption.install()
    emitter.attempt_started(host=socket.gethostname(), ts=trainer.process_start)
    code = EXIT_APPLICATION
    try:
        code = _train(trainer, emitter, warm_up)
        return code
    except (ModelContractError, _data_error()) as exc:
        code = _refused(exc, ident, emitter)
        return code
    except BaseException as exc:
        _crashed(exc, ident, emitter)
        raise
    finally:
        if code == EXIT_PREEMPTED and _unsaved_with_save_in_flight(trainer):
            _exit_now(trainer, emitter, code)
        if code != EXIT_OK:
            trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        emitter.close()
        _log_delivery(emitter, ident, env)


@dataclass(frozen=True, slots=True)
class _WarmUp:
    """A spare's warm-up, once it was told to go: when, the part of its phases the job
    waited for, and the error it met, raised as the attempt's own once it is one."""

    go_ts: float
    waited: list[Any]  # standby.Recorded, clipped to go_ts
    error: Exception | None

    def report(self, emitter: Emitter) -> None:
        for phase in self.waited:
            span = emitter.phase_start(phase.name, ts=phase.start)
            emitter.phase_end(phase.name, span, ts=phase.end)
        if self.error is not None:
            raise self.error


def _stand_by(trainer: Trainer, stream: TextIO) -> _WarmUp | None:
    """Warm up, then wait for the launcher's go; None when it lets the spare go."""
    from airflow_ett.trainer.standby import GoListener, PhaseRecorder, Recorded, clip_to

    listener = GoListener(stream)  # a go during the warm-up restores the priority at once
    recorder = PhaseRecorder([Recorded("trainer_init", trainer.process_start, time.time())])
    error: Exception | None = None
    try:
        trainer.warm_up(recorder)
    except Exception as exc:  # the attempt's failure, if it is ever told to go
        log.exception("warm standby: warm-up failed")
        error = exc
    log.info("warm standby ready %.1f s after its start: waiting to be told to go",
             time.time() - trainer.process_start)
    go = listener.wait()
    if go is None:
        log.info("warm standby not needed: exiting")
        return None
    os.environ.update(go.env)
    return _WarmUp(go.ts, clip_to(recorder.recorded, go.ts), error)


def _log_delivery(emitter: Emitter, ident: Identity, env: DistEnv) -> None:
    """One line saying what this rank's writer did with its events (`Emitter.delivery`):
    whoever reconciles the store against its reporters (the distributed tests; an
    operator chasing a gap in a timeline) counts the store's events whose id starts with
    `id_prefix` against `sent`."""
    delivery = emitter.delivery()
    if delivery["id_prefix"] is not None:
        log.info("ETT events sent by attempt %s rank %d: %s", ident.attempt_id, env.rank,
                 json.dumps(delivery, sort_keys=True))


def _unsaved_with_save_in_flight(trainer: Trainer) -> bool:
    left_for = trainer.left_for
    manager = getattr(trainer, "manager", None)
    return (left_for is not None and left_for.skip_save and manager is not None
            and manager.in_flight)


def _exit_now(trainer: Trainer, emitter: Emitter, code: int) -> NoReturn:
    """Leave without saving while a save is in flight: closing the checkpoint manager,
    or the interpreter's exit (which joins its writer thread), would wait for that save,
    which is known not to fit the grace. Its step directory stays uncommitted (the next
    attempt removes it) and the newest committed checkpoint is what resumes."""
    log.warning("leaving without waiting for the checkpoint in flight")
    manager = getattr(trainer, "manager", None)
    # a commit half reported is worse than none: wait out one being written, stop the rest
    if manager is not None and not manager.commit_lock.acquire(timeout=5.0):
        log.warning("a checkpoint commit did not finish within 5 s: leaving anyway")
    pipeline = getattr(trainer, "pipeline", None)
    if pipeline is not None:
        try:
            pipeline.close()
        except Exception as exc:
            log.warning("teardown: %s", exc)
    emitter.close()
    exit_record.exit(code)
    logging.shutdown()
    os._exit(code)


def _prewarm(cfg: TrainerConfig, ident: Identity, env: DistEnv, emitter: Emitter,
             world_size: int | None = None) -> int:
    """Compile on the fast batch, save the compile cache, exit: run once before a job (or
    a fleet of jobs with this model) so that their compilation is a cache load."""
    from airflow_ett.trainer.data import fast_batch

    trainer = Trainer(cfg, ident, env, emitter, time.time())
    cache = trainer._compile_cache()
    if cache is None:
        log.error(
            "prewarm needs compile = true, optimizations.compile_cache = true and a "
            "compile_cache_dir"
        )
        emitter.close()
        return EXIT_BAD_CONFIG
    try:
        with emitter.phase("cache_prewarm"):
            trainer._build_model()
            key = trainer.cache_key(world_size)
            load = cache.activate(key)
            trainer._compile_on(fast_batch(trainer._source()).to(env.device))
            if not load.hit:
                cache.save(key)
        log.info("prewarm: cache %s for key %s", "was already warm" if load.hit else "saved", key)
        return EXIT_OK
    finally:
        emitter.close()


@dataclass(frozen=True, slots=True)
class FinalState:
    """The model tensors of the newest valid checkpoint, and where in training they are.

    `step` and `cursor` come from the checkpoint's commit marker (`extra`), so whoever ships
    the tensors can say exactly which point of the run they are; `skipped` lists the newer
    checkpoints that were rejected (no marker, damaged files...) with why.
    """

    tensors: dict[str, torch.Tensor]
    step: int
    cursor: int | None
    path: Path
    extra: dict[str, Any]
    skipped: list[tuple[Path, str]]


class _ModelOnly(Stateful):
    """A checkpoint's `train` entry seen through the model alone.

    DCP loads only the keys asked for, so the optimizer state (as big as the model with
    Adagrad) is never read, and the same request fits both layouts of `TrainState`: one
    process (`{"model", "optim"}`) and several (`{"model", "optim_dense", "optim_sparse"}`,
    the tables as ShardedTensors that DCP reassembles into whole tensors here). Loading a
    multi-rank checkpoint with a plain optimizer fails on the optimizer keys instead.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(self.model)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state_dict["model"])


def restore_final_state(cfg: TrainerConfig) -> FinalState:
    """Load the newest valid committed checkpoint of `cfg.checkpoint_dir` on CPU, in this
    process alone, through the same validation as a restart (markers, checksums, fallback
    to older checkpoints). The one way the trainer's results leave it (tests, publish).

    Call it outside torch.distributed (or on every rank): with a process group the
    manager's restore is collective. Raises FileNotFoundError naming the directory when it
    holds no committed checkpoint that loads (the skipped ones are logged with why), and
    `CheckpointError` when a load failed half-way with nothing older to fall back to.
    """
    from airflow_ett.trainer.checkpoint import CheckpointManager

    directory = Path(cfg.checkpoint_dir)
    if not directory.is_dir():  # the manager would create it: a reader must not
        raise FileNotFoundError(f"no checkpoint directory {directory}")
    model = build_for(cfg).module
    manager = CheckpointManager(directory, keep_last=cfg.keep_last, async_save=False)
    try:
        result = manager.restore({"train": _ModelOnly(model)})
    finally:
        manager.close()
    if result is None:
        invalid = len(list(directory.glob("step-*")))
        raise FileNotFoundError(
            f"no committed checkpoint in {directory}"
            + (f" ({invalid} step directories, none valid: see the warnings)" if invalid else "")
        )
    extra = dict(result.extra)
    cursor = extra.get("cursor")
    return FinalState(
        tensors={k: v.detach().clone() for k, v in model.state_dict().items()},
        step=result.step,
        cursor=int(cursor) if cursor is not None else None,
        path=result.path,
        extra=extra,
        skipped=list(result.skipped),
    )


def load_final_state(cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """The newest checkpoint's model tensors, on CPU (what the publish step ships)."""
    return restore_final_state(cfg).tensors
