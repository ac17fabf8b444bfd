"""The start-up's compile step, through the compile cache (`compile_cache.py`).

An attempt's start, a warm spare's warm-up and a prewarm compile the model's named parts
the same way (`compile_through`): load the cache entry for this model, device, batch size
and world (`entry_key`), then compile on a batch, forward and backward with the tables
detached (`contract.warm_compile`). An entry that missed, or that could not load every
forward, is saved once the first real step's backward has run (`save_in_background`, on
one rank: the same entry), off the loop's critical path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import torch

from airflow_ett.trainer.config import TrainerConfig

if TYPE_CHECKING:  # inductor loads late
    from airflow_ett.ett.events import ComponentName
    from airflow_ett.trainer.compile_cache import CompileCache

log = logging.getLogger("airflow_ett.trainer")


class Phases(Protocol):
    """Where a start-up step's phase goes: the emitter, or a warm spare's recorder
    (`trainer/standby.py`), which reports it only once the spare is the attempt."""

    def phase(self, name: str, component: ComponentName | None = None
              ) -> AbstractContextManager[str]: ...


def open_cache(cfg: TrainerConfig) -> CompileCache | None:
    """The compile cache the config asks for; None: compile, the cache or its directory
    off."""
    if not (cfg.compile and cfg.optimizations.compile_cache and cfg.compile_cache_dir):
        return None
    from airflow_ett.trainer.compile_cache import CompileCache

    return CompileCache(cfg.compile_cache_dir)


def entry_key(cfg: TrainerConfig, device: torch.device, world_size: int) -> str:
    """The cache entry's key; `world_size`: the job's (a one-process prewarm compiles for
    a larger job)."""
    from airflow_ett.trainer.compile_cache import device_kind, trainer_cache_key

    return trainer_cache_key(cfg.cache_identity(), device_kind(device),
                             batch_size=cfg.batch_size, world_size=world_size)


def compile_through(cache: CompileCache | None, key: Callable[[], str],
                    compile_on: Callable[[], None], phases: Phases) -> bool:
    """Compile (`compile_on`), through the cache when there is one (its entry `key()`);
    True when the cache missed and should be saved once backward has run."""
    from airflow_ett.trainer.compile_cache import import_compiler_modules

    missed = False
    with phases.phase("compile"):
        began = time.perf_counter()
        if cache is None:  # `activate` does it otherwise
            import_compiler_modules()  # after an import begun ahead, if any, has ended
        else:
            with phases.phase("cache_load"):
                load = cache.activate(key())
            missed = not load.hit
            log.info(
                "compile cache %s (%s)", "hit" if load.hit else "miss", load.reason or "ok"
            )
        _log_import_ahead(began)
        compile_on()
    # a hit whose forwards could not all be loaded compiled them here: save those too,
    # or every later start compiles them again
    return missed or (cache is not None and cache.needs_save())


def _log_import_ahead(compile_began: float) -> None:
    """How long the compiler import begun ahead took, and how much of it the compile
    waited for (`start_compiler_import`)."""
    from airflow_ett.trainer.compile_cache import compiler_import_ahead

    ahead = compiler_import_ahead()
    if ahead is None:
        return
    began, ended = ahead
    if ended is None:
        return
    log.info("compiler import ahead: %.2fs on its thread, %.2fs of it after the compile began",
             ended - began, max(0.0, ended - compile_began))


def log_counters(when: str) -> None:
    from airflow_ett.trainer.compile_cache import compile_counters, format_counters

    log.info("compile %s: %s", when, format_counters(compile_counters()))


def save_in_background(cache: CompileCache, key: str) -> threading.Thread:
    """Save the cache entry `key` on a daemon thread (started): join it before the
    process exits, so that the entry is whole."""
    saver = threading.Thread(
        target=_save_cache,
        args=(cache, key),
        name="ett-cache-save",
        daemon=True,
    )
    saver.start()
    return saver


def _save_cache(cache: CompileCache, key: str) -> None:
    try:
        path = cache.save(key)
        log.info("compile cache saved: %s", path)
    except Exception as exc:
        log.warning("compile cache not saved: %s", exc)
