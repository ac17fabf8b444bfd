"""`CompileCachePrewarmOperator`: compile once, before the job holds its GPUs.

Compilation is the largest single piece of a cold start, and every restart repeats it.
Run ahead of the train task (on a CPU worker here; on a fleet, on one GPU of the right
kind rather than the job's whole allocation), this leaves an entry in the shared compile
cache under exactly the key the job's ranks will look up, so their compile is a load.
On a hit it only checks the entry and says so.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from airflow_ett._proc import terminate_tree
from airflow_ett.operators.base import EttTrainerOperator
from airflow_ett.operators.errors import TrainerConfigError
from airflow_ett.operators.job import JobConfigError, JobPaths, reader
from airflow_ett.protocol.exits import EXIT_BAD_CONFIG, EXIT_OK

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The longest `timeout_s` (docs/decisions/0023): a cold compile with autotuning takes
#: minutes to an hour; a prewarm still compiling after a day has failed.
MAX_PREWARM_S = 86_400.0


class PrewarmResult(TypedDict):
    """What a prewarm returns (its XCom): `hit` None and `key` None when there is
    nothing to prewarm (compile or the cache off); on a miss, whether the compile
    `saved` an entry and its exit code."""

    hit: bool | None
    key: str | None
    saved: NotRequired[bool]
    exit_code: NotRequired[int]


class CompileCachePrewarmOperator(EttTrainerOperator):
    """Fill the compile cache for a lifecycle job's model, shapes and world size.

    A failed prewarm does not fail the job (the train task then compiles cold, which is
    slower but correct), except for a config the trainer refuses: that would fail the
    train task too, so it fails here, early, without retries.

    :param timeout_s: the longest a prewarm compile may take before it is abandoned.
    """

    ett_role = "prewarm"
    ui_color = "#fdf3d8"

    def __init__(self, *, queue: str = "cpu", timeout_s: float = 1800.0, **kwargs: Any) -> None:
        super().__init__(queue=reader(type(self).__name__).text("queue", queue), **kwargs)
        self.timeout_s = reader(type(self).__name__).number("timeout_s", timeout_s, above=0,
                                                            maximum=MAX_PREWARM_S)
        self._proc: subprocess.Popen[str] | None = None
        self._killed: threading.Event | None = None

    def execute(self, context: Context) -> PrewarmResult:
        started = time.monotonic()
        try:
            paths, cfg = self.prepare(context)
        except JobConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        if not (cfg.compile and cfg.optimizations.compile_cache):
            self.log.info("compile or the compile cache is off for this job: nothing to prewarm")
            return {"hit": None, "key": None}

        emitter = self.emitter(context)
        span = emitter.phase_start("cache_prewarm")  # the key's torch import counts too
        try:
            from airflow_ett.trainer.compile_cache import (
                CompileCache,
                device_kind,
                trainer_cache_key,
            )

            key = trainer_cache_key(cfg.cache_identity(), device_kind(None),
                                    batch_size=cfg.batch_size, world_size=self.nproc)
            cache = CompileCache(paths.compile_cache_dir)
            if cache.has(key):
                self.log.info("compile cache hit for %s (key %s): nothing to compile; "
                              "checked in %.2f s", cfg.model.name, key,
                              time.monotonic() - started)
                return {"hit": True, "key": key}
            self.log.info("compile cache miss for %s (key %s): compiling on the fast batch",
                          cfg.model.name, key)
            code = self._compile(paths, self.job_id(context))
        finally:
            emitter.phase_end("cache_prewarm", span)
            emitter.flush()
        if code == EXIT_BAD_CONFIG:
            raise TrainerConfigError(f"the trainer refused {paths.config_file} (exit 78); "
                                     "see the log above")
        saved = code == EXIT_OK and cache.has(key)
        if saved:
            self.log.info("compile cache saved for key %s in %.1f s", key,
                          time.monotonic() - started)
        else:
            self.log.warning("prewarm did not save a cache entry (exit code %s): the train "
                             "task will compile cold", code)
        return {"hit": False, "key": key, "saved": saved, "exit_code": code}

    def _compile(self, paths: JobPaths, job: str) -> int:
        from airflow_ett.trainer.launcher import run_attempts

        def on_start(proc: subprocess.Popen[str], _number: int, _attempt: str) -> None:
            self._proc = proc

        # The trainer reports nothing here: the operator's job-level `cache_prewarm`
        # phase is the record (a trainer "attempt" would count as a job attempt).
        self._killed = threading.Event()
        result = run_attempts(
            paths.config_file, job, max_attempts=1, attempt_id=lambda _n: "prewarm",
            env={**self.child_env(paths), "AIRFLOW__ETT__DISABLED": "True"},
            extra_args=["--prewarm", "--prewarm-world-size", str(self.nproc)],
            on_output=self.log.info, timeout=self.timeout_s, on_start=on_start,
            stop=self._killed,
        )
        self._proc = None
        return result.last.exit_code

    def on_kill(self) -> None:
        """End the prewarm compile and every process under it. Nothing is lost: a
        cache entry is committed atomically or not at all, so a killed compile leaves
        no half entry for the train task to trip on."""
        if self._killed is not None:
            self._killed.set()
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        ended = terminate_tree(proc, grace_s=5.0)
        self.log.info("on_kill: ended the prewarm compile (pid %d): %d process(es) signalled, "
                      "%d needed SIGKILL", proc.pid, len(ended.signalled), len(ended.killed))
