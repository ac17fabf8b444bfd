"""One attempt as a process: from `python -m airflow_ett.trainer` to its exit code.

`run` builds this rank's emitter and `Trainer` (`loop.py`), reports the attempt's start
and end, and turns every way it ends into an exit code (`protocol/exits.py`): trained
(0), preempted (75), the owner's code or data refused (78: retrying will not change
either), anything else an application failure (1, the traceback in the log). A warm
spare (`standby`) warms up and waits first (`standby.stand_by`); `prewarm` only fills the
compile cache. Before returning it has closed everything that must be closed (pipeline,
checkpoint writer, process group, emitter), so that `__main__` may leave with `os._exit`
(docs/decisions/0018-warm-standby-and-fast-exit.md).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import TYPE_CHECKING, TextIO

import torch.distributed as dist

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.protocol.exits import (
    EXIT_APPLICATION,
    EXIT_BAD_CONFIG,
    EXIT_OK,
    EXIT_PREEMPTED,
    exit_record,
)
from airflow_ett.trainer.compiling import open_cache
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.contract import ModelContractError
from airflow_ett.trainer.identity import DistEnv, Identity
from airflow_ett.trainer.leaving import exit_now
from airflow_ett.trainer.loop import Trainer

if TYPE_CHECKING:
    from airflow_ett.trainer.standby import WarmUp

log = logging.getLogger("airflow_ett.trainer")


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
    warm_up: WarmUp | None = None
    if standby is not None:
        from airflow_ett.trainer.standby import stand_by

        warm_up = stand_by(trainer.warm_up, trainer.process_start, standby)
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
        manager = getattr(trainer, "manager", None)
        if code == EXIT_PREEMPTED and trainer.leaving.unsaved_with_save_in_flight(manager):
            exit_now(manager, getattr(trainer, "pipeline", None), emitter, code)
        if code != EXIT_OK:
            trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        emitter.close()
        _log_delivery(emitter, ident, env)


def _train(trainer: Trainer, emitter: Emitter, warm_up: WarmUp | None) -> int:
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
                          message=trainer.leaving.message())
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
    """Every other failure: the traceback in the log, the attempt failed (application)."""
    exit_record.failed(time.time(), f"{type(exc).__name__}: {exc}")
    log.exception("attempt %s failed", ident.attempt_id)
    exit_record.reported("application")
    emitter.attempt_ended("failed", cause="application", exit_code=EXIT_APPLICATION,
                          message=f"{type(exc).__name__}: {exc}"[:500])


def _data_error() -> type[Exception]:
    from airflow_ett.trainer.files import DataError

    return DataError


def _rank_emitter(ident: Identity, env: DistEnv, sink: JsonlSink | None) -> Emitter:
    """This rank's emitter; `[ett] disabled` decides on every rank (None: read the
    setting). The host's spool holds other jobs' events, meant for the store: an attempt
    writing to its own events file must not replay them into it, and only rank 0 replays
    (one replayer per host and attempt)."""
    return Emitter(ident.job_id, ident.attempt_id, sink=sink, disabled=None,
                   replay_on_start=sink is None and env.is_reporter, rank=env.rank)


def _log_delivery(emitter: Emitter, ident: Identity, env: DistEnv) -> None:
    """One line saying what this rank's writer did with its events (`Emitter.delivery`):
    whoever reconciles the store against its reporters (the distributed tests; an
    operator chasing a gap in a timeline) counts the store's events whose id starts with
    `id_prefix` against `sent`."""
    delivery = emitter.delivery()
    if delivery["id_prefix"] is not None:
        log.info("ETT events sent by attempt %s rank %d: %s", ident.attempt_id, env.rank,
                 json.dumps(delivery, sort_keys=True))


def _prewarm(cfg: TrainerConfig, ident: Identity, env: DistEnv, emitter: Emitter,
             world_size: int | None = None) -> int:
    """Compile on the fast batch, save the compile cache, exit: run once before a job (or
    a fleet of jobs with this model) so that their compilation is a cache load."""
    from airflow_ett.trainer.data import fast_batch

    trainer = Trainer(cfg, ident, env, emitter, time.time())
    cache = open_cache(cfg)
    if cache is None:
        log.error(
            "prewarm needs compile = true, optimizations.compile_cache = true and a "
            "compile_cache_dir"
        )
        emitter.close()
        return EXIT_BAD_CONFIG
    try:
        with emitter.phase("cache_prewarm"):
            trainer.build_model()
            key = trainer.cache_key(world_size)
            load = cache.activate(key)
            trainer.compile_on(fast_batch(trainer.source()).to(env.device))
            if not load.hit:
                cache.save(key)
        log.info("prewarm: cache %s for key %s", "was already warm" if load.hit else "saved", key)
        return EXIT_OK
    finally:
        emitter.close()
