"""The training loop of one attempt: start up, step, checkpoint, finish (`Trainer`).

The start-up is a small dependency graph, run in parallel when `parallel_init` is on:

    checkpoint discovery (cheap: which checkpoint, which data cursor)
      |-> data pipeline start at that cursor ............................ (thread)
      |-> model creation -> checkpoint restore -> compile on the fast batch (main thread)
    then: wait for the first real batch, train.

Without `fast_batch`, compilation waits for the first real batch (the baseline the
source work measured); without `parallel_init`, everything runs one after the other.
A warm spare has built and compiled before it was needed (`warm_up`): `start` then
restores and gives the connected pipeline its cursor. Each step is followed by: maybe
checkpoint (when, `checkpoint_timing.py`), maybe log, maybe fault, leave if SIGTERMed
(how, `leaving.py`). Every rank reports its own phases, tagged with its rank; rank 0
alone reports progress (`progress.py`) and checkpoints, which are the job's
(docs/decisions/0017-multi-rank.md). The process around it (the attempt's start and
end, exit codes) is `run.py`; reading the results back, `final_state.py`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from airflow_ett.emit import Emitter
from airflow_ett.protocol.env import FIRST_STEP_FILE_ENV
from airflow_ett.protocol.exits import EXIT_OK, EXIT_PREEMPTED
from airflow_ett.protocol.leave import PreemptionFlag, signal_first_step
from airflow_ett.trainer.bad_rows import BadRows
from airflow_ett.trainer.checkpoint_timing import SaveTiming
from airflow_ett.trainer.compiling import (
    Phases,
    compile_through,
    entry_key,
    log_counters,
    open_cache,
    save_in_background,
)
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.contract import warm_compile
from airflow_ett.trainer.faults import FaultInjector
from airflow_ett.trainer.identity import DistEnv, Identity
from airflow_ett.trainer.leaving import Leaving
from airflow_ett.trainer.model import build_for, shard, single_process
from airflow_ett.trainer.progress import Progress, StepLogger
from airflow_ett.trainer.rank_steps import Probe, RankClock, probe_group
from airflow_ett.trainer.state import (
    TrainExtra,
    TrainState,
    read_train_extra,
    set_rng_state,
    train_extra,
)
from airflow_ett.trainer.watchdog import HangWatchdog, exit_hung

if TYPE_CHECKING:  # imported where used: torchrec (data) and inductor (cache) load late
    from airflow_ett.trainer.checkpoint import CheckpointManager, SaveResult
    from airflow_ett.trainer.compile_cache import CompileCache
    from airflow_ett.trainer.data import Batch, DataPipeline
    from airflow_ett.trainer.data_source import Source
    from airflow_ett.trainer.standby import PhaseRecorder

log = logging.getLogger("airflow_ett.trainer")


@dataclass(slots=True)
class Trainer:
    cfg: TrainerConfig
    ident: Identity
    env: DistEnv
    emitter: Emitter
    process_start: float
    preemption: PreemptionFlag = field(default_factory=PreemptionFlag)
    # model: set by `build_model`; manager and pipeline: by `start` (unset before)
    model: torch.nn.Module = field(init=False, repr=False)
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    manager: CheckpointManager = field(init=False, repr=False)
    pipeline: DataPipeline = field(init=False, repr=False)
    step: int = 0
    cursor: int = 0
    bad_rows: BadRows = field(init=False, repr=False)  # the job's, kept in its checkpoints
    compile_names: tuple[str, ...] = ()  # the model's parts to compile (the contract's)
    # per step being saved: (save start time, final save?, data cursor), until committed
    saves_in_flight: dict[int, tuple[float, bool, int]] = field(default_factory=dict)
    # the step of the latest save begun (committed once `manager.wait` returns)
    last_save_step: int | None = None
    timing: SaveTiming = field(init=False, repr=False)  # set by `start`
    leaving: Leaving = field(init=False, repr=False)  # the request it left on, if any
    _cache_to_save: CompileCache | None = None  # the cache missed: save after the first step
    _cache_saver: threading.Thread | None = None
    _faults: FaultInjector | None = None  # set by `train`: a slow_save acts in `save`
    _probe: Probe | None = None  # set by `train` when there are ranks to wait for
    _rank_clock: RankClock | None = None
    _warmed: bool = False  # a warm spare: model built and compiled before it was needed

    def __post_init__(self) -> None:
        self.leaving = Leaving(self.env, self.cfg.grace_s)
        self.bad_rows = BadRows(self.cfg.data.max_bad_rows, self.env)

    # -- start-up ------------------------------------------------------------------------

    def source(self) -> Source:
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
            self.source(),
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
        )

    def _discover(self) -> TrainExtra | None:
        """The newest committed checkpoint's `extra` (cursor, step), without loading it:
        the data pipeline can start at the right cursor while the model is built."""
        latest = self.manager.latest()
        if latest is None:
            return None
        from airflow_ett.trainer.checkpoint import read_marker

        try:
            return read_train_extra(read_marker(Path(latest)).extra, where=str(latest))
        except (OSError, ValueError) as exc:
            log.warning("checkpoint %s: cannot read its marker (%s); restore decides", latest, exc)
            return None

    def build_model(self) -> None:
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

    def _restore(self) -> TrainExtra | None:
        result = self.manager.restore({"train": self._train_state()})
        if result is None:
            return None
        for path, reason in result.skipped:
            log.warning("checkpoint %s skipped: %s", path, reason)
        extra = read_train_extra(result.extra, where=str(result.path))
        if "rng" in extra:
            set_rng_state(extra["rng"])
        log.info("restored step %d (cursor %d) from %s", extra["step"], extra["cursor"],
                 result.path)
        return extra

    def compile_on(self, batch: Batch) -> None:
        """Compile the model's named parts by running it forward and backward on `batch`
        with the tables detached: no parameter is updated (the tables' fused optimizer
        would step in backward), yet the graphs are exactly those training will run."""
        warm_compile(self.model, self.compile_names, batch.model_input())

    def cache_key(self, world_size: int | None = None) -> str:
        """`world_size`: the job's, when a one-process prewarm compiles for a larger job."""
        return entry_key(self.cfg, self.env.device, world_size or self.env.world_size)

    def _compile(self, batch: Batch, cache: CompileCache | None,
                 phases: Phases | None = None) -> bool:
        """Compile on `batch` (through the cache when there is one); True when the cache
        missed and should be saved once backward has run. Phases go to `phases` (the
        emitter)."""
        return compile_through(cache, self.cache_key, lambda: self.compile_on(batch),
                               phases if phases is not None else self.emitter)

    def warm_up(self, phases: PhaseRecorder) -> None:
        """A warm spare's part of the start, before it is an attempt (nothing reported:
        `phases` records): the model built and compiled on the fast batch through the
        compile cache, and the data pipeline connected (its workers started, waiting to
        be told the cursor: the restore says it). `start` then restores, gives the
        pipeline its cursor and skips the rest."""
        from airflow_ett.trainer.data import fast_batch

        self.pipeline = self._data_pipeline(None)
        self.pipeline.start()
        self._import_compiler_ahead()
        with phases.phase("model_creation"):
            self.build_model()
        cache = open_cache(self.cfg)
        if self.cfg.compile and self._compile(
                fast_batch(self.source()).to(self.env.device), cache, phases):
            self._cache_to_save = cache
        self._warmed = True

    def start(self) -> Iterator[Batch]:
        """Everything up to the first real batch; returns the batch iterator."""
        cfg, em = self.cfg, self.emitter
        trainer_init = None if self._warmed else em.phase_start(
            "trainer_init", ts=self.process_start)
        if self.env.world_size > 1 and not dist.is_initialized():
            self._import_compiler_ahead()  # over the rendezvous, a wait without the GIL
            with em.phase("process_group_init"):
                dist.init_process_group("nccl" if self.env.device.type == "cuda" else "gloo")
        self.manager = self._checkpoint_manager()
        self.timing = SaveTiming.from_config(cfg, self.ident.job_id, self.env)
        resume = self._discover()
        if self._warmed:  # connected while the spare waited
            self.pipeline.set_start_cursor(resume["cursor"] if resume else 0)
        else:
            self.pipeline = self._data_pipeline(resume["cursor"] if resume else 0)
        if trainer_init is not None:
            em.phase_end("trainer_init", trainer_init)
        cache = None if self._warmed else open_cache(self.cfg)
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

    def _import_compiler_ahead(self) -> None:
        """With `parallel_init`, start importing torch's compiler on a thread
        (`start_compiler_import`, a second or two; once a process), so that it can run
        while this thread waits without the GIL (the process group's rendezvous, device
        set-up, checkpoint reads) instead of opening the compile step; `activate` waits
        for what is left of it. Started once the data pipeline has started (or before a
        rendezvous), never before: on a start-up that is all Python the thread only takes
        the GIL from the others, and the data pipeline's start must not wait for it. The
        data module first, on this thread: it imports torchrec, which imports parts of
        torch's compiler itself, and two threads must not import the same modules at once
        (module locks; see `start_compiler_import`)."""
        if not (self.cfg.compile and self.cfg.optimizations.parallel_init):
            return
        import airflow_ett.trainer.data  # noqa: F401  (torchrec, before the thread starts)
        from airflow_ett.trainer.compile_cache import start_compiler_import

        start_compiler_import()

    def _start_data_and_model(self, resume: TrainExtra | None,
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
                    self.build_model()
            if resume is not None:
                with em.phase("checkpoint_restore"):
                    restored = self._restore()
                self._resume_from(restored)
            if cfg.compile and cfg.optimizations.fast_batch and not self._warmed:
                missed.append(self._compile(fast_batch(self.source()).to(self.env.device), cache))

        if cfg.optimizations.parallel_init:
            data_thread = threading.Thread(target=start_data, name="ett-data-init")
            data_thread.start()
            if not self._warmed:
                self._import_compiler_ahead()
            build_restore_compile()
            with em.phase("first_batch"):
                data_thread.join()
        else:
            start_data()
            build_restore_compile()
        if data_error:
            raise data_error[0]
        return missed

    def _resume_from(self, restored: TrainExtra | None) -> None:
        if restored is not None:
            self.step = restored["step"]
            self.cursor = restored["cursor"]
            self.bad_rows.job = restored.get("bad_rows", 0)

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
        extra = train_extra(
            step=self.step, cursor=self.cursor, model=self.cfg.model.name,
            # what preflight compares, so another model's job refuses this directory
            model_identity=self.cfg.model_identity, world_size=self.env.world_size,
            bad_rows=self.bad_rows.at_save())
        return self.manager.save(self.step, {"train": self._train_state()}, dict(extra))

    def _maybe_checkpoint(self, now: float, progress: Progress, beat: Callable[[], None]
                          ) -> bool:
        """The periodic save, when it is due (`checkpoint_timing`). True: leave now, this
        save committed, as an `at_checkpoint` preemption request asked."""
        if not self.timing.due(self.step, now):
            return False
        progress.flush(now)
        # before the save: see `manager.broadcast`
        request = self.leaving.claim_at_save(self.manager, since=self.process_start)
        started = time.time()
        result = self.save()
        self.timing.saved(self.step, started, time.time(), result.blocking_s,
                          in_flight=bool(self.saves_in_flight))
        beat()
        if request is None:
            return False
        self.leaving.at_checkpoint(request, self.manager, self.step, self.save)
        beat()
        return True

    # -- the loop ------------------------------------------------------------------------

    def train(self, batches: Iterator[Batch]) -> int:
        cfg, em = self.cfg, self.emitter
        progress = Progress(em, self.timing.next_save_ts)
        if cfg.rank_report_s is not None:
            self._probe = probe_group()  # every rank, here: a collective
            if self._probe is not None:
                self._rank_clock = RankClock(em, cfg.rank_report_s)

        def before_fault(now: float) -> None:
            progress.flush(now)
            if self._rank_clock is not None:
                self._rank_clock.flush(now)

        self._faults = faults = FaultInjector(
            cfg.faults, self.ident.attempt_number, rank=self.env.rank,
            before_fault=before_fault,
            before_kill=lambda: em.flush(1.0))
        self.timing.start(self.step)
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
        return HangWatchdog(timeout, lambda last_beat, now: exit_hung(
            em, timeout, self.step, last_beat, now))

    def _loop(self, batches: Iterator[Batch], progress: Progress, faults: FaultInjector,
              steps: StepLogger, beat: Callable[[], None]) -> int:
        """Step, then: maybe checkpoint (and leave on it, if asked), maybe log, maybe
        fault, leave if SIGTERMed. The SIGTERM check comes last so that a step just saved
        periodically is not saved again to leave."""
        first_step = self.step
        while self.step < self.cfg.steps:
            fetch = time.time()  # a rank's own step begins with its batch
            loss, now = self._step(next(batches), progress, fetch)
            if self.step == first_step + 1:
                self._after_first_step()
            beat()
            self.timing.step_ended(now, saving=bool(self.saves_in_flight))
            if self._maybe_checkpoint(now, progress, beat):
                return EXIT_PREEMPTED
            steps.step_done(self.step, loss, now)
            faults.after_step(self.step, now)
            if self.preemption.requested:
                progress.flush(now)
                self._flush_rank_clock(now)
                return self.leaving.on_sigterm(self.manager, self.step, self.last_save_step,
                                               self.save, self.preemption.received_at)
        progress.flush()
        self._flush_rank_clock()
        return EXIT_OK

    def _flush_rank_clock(self, now: float | None = None) -> None:
        if self._rank_clock is not None:
            self._rank_clock.flush(now)

    def _step(self, batch: Batch, progress: Progress, fetch: float) -> tuple[float, float]:
        """One training step on `batch` (asked for at `fetch`), recorded; returns (loss,
        when it ended). Every rank's own part comes before the probe (rank_steps.py)."""
        if batch.skipped:
            self.bad_rows.count(batch)
        batch = batch.to(self.env.device)
        if self.manager.staging_pending:  # the last save's copy lands before any update
            # No phase of its own: a `checkpoint_save_blocking` opened here would read as
            # a new save begun (scheduling/live.py). The wait is in the save's
            # `checkpoint_saved.blocking_s` (CSBT) and, in the timeline, wasted training.
            self.manager.wait_staged()
        faults = self._faults
        delay = 0.0 if faults is None else faults.step_delay_s(self.step + 1)
        if delay:
            time.sleep(delay)
        wait = self._probe() if self._probe is not None else 0.0
        t0 = time.time()
        loss = float(self._train_step(batch))
        if self.cfg.step_sleep_s:
            time.sleep(self.cfg.step_sleep_s)
        t1 = time.time()
        self.step += 1
        self.cursor = batch.cursor_end
        progress.add(self.step, batch.cursor_start, batch.cursor_end, t0, t1, loss)
        if self._rank_clock is not None:
            self._rank_clock.add(self.step, fetch, t1, wait)
        return loss, t1

    def _after_first_step(self) -> None:
        """Compilation is complete once backward ran: report it, and save a cache that
        missed (off the loop's critical path; `close` joins it so the entry is whole)."""
        if self.env.is_reporter:  # the launcher's cue for a spare
            signal_first_step(_env_path(FIRST_STEP_FILE_ENV))
        if self.cfg.compile:
            log_counters("after the first real step")
        cache, self._cache_to_save = self._cache_to_save, None
        if cache is not None and self.env.is_reporter:  # one rank saves: the same entry
            self._cache_saver = save_in_background(cache, self.cache_key())

    def _train_step(self, batch: Batch) -> torch.Tensor:
        loss: torch.Tensor = self.model(batch.model_input())[0]
        torch.autograd.backward(loss)
        for opt in self.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def finish(self) -> None:
        em = self.emitter
        with em.phase("final_checkpoint"):
            if self.timing.final_due(self.step, self.manager.latest_step()):
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


def _nothing() -> None:
    """No watchdog: nothing to tell."""


def _chain_first(first: Batch, rest: Iterator[Batch]) -> Iterator[Batch]:
    yield first
    yield from rest


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
