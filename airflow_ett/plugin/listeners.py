"""The Airflow listener: task-level boundaries of every recorded DAG run.

Where each hook fires (Airflow 3.3): DAG-run hooks in the scheduler, inside its
transaction (and in the API server when a person sets a run's state); task-instance hooks
in the task process on the worker, in the scheduler for tasks killed from outside, and in
the API server for states set by hand. What this records:

- `on_dag_run_running`: `job_submitted` at the run's `queued_at` (E2E starts there);
- task tries `running` / `success` / `failed` / `up_for_retry`: `task_state` events, and a
  `retry_delay` phase when Airflow will retry after a delay;
- the DAG run's end: `job_ended`, only as a fallback for jobs whose train task never
  said so (it failed before training, or was killed), checked against the store; then
  the job's ETT metrics and the emitter's counters go out through Airflow's `Stats`
  (`metrics.py`, docs/metrics.md), as do the counters at `before_stopping`;
- while a train task's try runs, in its process on the worker: its job's rolling-window
  gauges, from a daemon thread (`window_metrics.py`, decision 0030), stopped when the try
  ends.

User-written text leaves the process only through Airflow's secrets maskers (`_redact`):
a DAG run's `conf` and a failure's message may hold a password or token that Airflow
knows of (a connection, a variable, `mask_secret`) or that sits under a sensitive key,
and the store is read by more people than the task's own logs.

The hook bodies copy plain values off the Airflow objects (never touching Airflow's ORM
session or a lazy relationship) and hand them to the emitter, which writes on its own
thread and spools when the store is down. Work that must read the store (the fallback
end, states set in the API server for DAGs it cannot see the tags of) runs on one daemon
thread here, so no hook ever waits on I/O. Every body is guarded: whatever goes wrong is
logged, rate-limited, and never reaches Airflow. The worker's task process exits right
after its last hook, so `before_stopping` flushes, bounded by `[ett] emit_timeout`.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, ParamSpec

from pluggy import HookimplMarker

from airflow_ett.emit import Emitter, get_emitter
from airflow_ett.emit._log import RateLimitedLog
from airflow_ett.ett.events import JobStatus, TaskSource
from airflow_ett.jobs import DagRecording, job_id_for, recording_of
from airflow_ett.plugin import metrics
from airflow_ett.plugin.window_metrics import WindowReporter
from airflow_ett.settings import EttSettings, RollingSettings

hookimpl = HookimplMarker("airflow")  # the marker Airflow's listener managers collect

# The name predates the move into plugin/ and is kept: it is what Airflow's task logs show
# and what a logging config filters on.
log = logging.getLogger("airflow_ett.listeners")
_rate_limited = RateLimitedLog(log)

P = ParamSpec("P")

_BACKGROUND_QUEUE: Final = 1024
MESSAGE_CHARS: Final = 500
# Redact a little more than is kept, so that a secret straddling the cut is still whole
# when the masker looks for it.
_REDACT_CHARS: Final = 4 * MESSAGE_CHARS
_REDACTION_FAILED: Final = "<redaction-failed>"
# Each Airflow process registers secrets with one of two maskers: the Task SDK's (the
# task process on a worker) and core's (scheduler, API server, dag processor). Both are
# applied; either may be missing from an install, and each is imported once, on first use.
_MASKER_MODULES: Final = ("airflow.sdk._shared.secrets_masker", "airflow._shared.secrets_masker")
_redactors: list[Callable[[Any], Any]] | None = None


def _load_redactors() -> list[Callable[[Any], Any]]:
    global _redactors
    if _redactors is None:
        import importlib

        found: list[Callable[[Any], Any]] = []
        for name in _MASKER_MODULES:
            try:
                found.append(importlib.import_module(name).redact)
            except (ImportError, AttributeError):
                continue
        _redactors = found
    return _redactors


def _redact(value: Any) -> Any:
    """`value` as Airflow's secrets maskers would log it: registered secrets and values
    under sensitive keys (password, token, ...) become `***`.

    Fails closed: if a masker raises, the value is replaced, never passed on as is.
    """
    try:
        for redact in _load_redactors():
            value = redact(value)
        return value
    except Exception:
        return _REDACTION_FAILED


def _message(error: BaseException | str | None) -> str | None:
    if error is None:
        return None
    text = _redact(str(error)[:_REDACT_CHARS])
    return str(text)[:MESSAGE_CHARS]


def _guarded(fn: Callable[P, None]) -> Callable[P, None]:
    """A hook body that can never raise into Airflow."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            _rate_limited(logging.WARNING, f"{fn.__name__}-{type(exc).__name__}",
                          "ETT listener %s: not recorded: %r", fn.__name__, exc, exc_info=exc)

    return wrapper


def _ts(value: Any) -> float | None:
    return value.timestamp() if isinstance(value, datetime) else None


def _state_name(state: Any) -> str:
    value = getattr(state, "value", state)
    return str(value) if value is not None else "none"


@dataclass(frozen=True, slots=True)
class TaskTry:
    """The plain values a task hook needs, copied off the task instance."""

    dag_id: str
    run_id: str
    task_id: str
    try_number: int
    map_index: int
    state: str
    source: TaskSource
    recording: DagRecording | None  # None: the tags cannot be seen from this process
    role: str  # the operator's `ett_role` ("train", "prewarm", ...), "" for any other task
    retry_delay_s: float | None
    message: str | None

    @property
    def job(self) -> str:
        return job_id_for(self.dag_id, self.run_id)


def _source(previous_state: Any, task_instance: Any) -> TaskSource:
    if type(task_instance).__name__ == "RuntimeTaskInstance":
        return "worker"
    return "api" if previous_state is None else "scheduler"


def _task_try(previous_state: Any, ti: Any, state: str | None = None,
              error: BaseException | str | None = None) -> TaskTry:
    task = getattr(ti, "task", None)
    dag = getattr(task, "dag", None)
    tags = getattr(dag, "tags", None)
    delay = getattr(task, "retry_delay", None)
    backoff = bool(getattr(task, "retry_exponential_backoff", False))
    map_index = getattr(ti, "map_index", None)
    return TaskTry(
        dag_id=str(ti.dag_id), run_id=str(ti.run_id), task_id=str(ti.task_id),
        try_number=int(getattr(ti, "try_number", 0) or 0),
        map_index=-1 if map_index is None else int(map_index),
        state=state or _state_name(getattr(ti, "state", None)),
        source=_source(previous_state, ti),
        recording=recording_of(tags) if tags is not None else None,
        role=str(getattr(task, "ett_role", "") or ""),
        retry_delay_s=(delay.total_seconds() if isinstance(delay, timedelta) and not backoff
                       else None),
        message=_message(error),
    )


class _Background:
    """One daemon thread for the few hook actions that read the store first.

    A daemon thread, not a ThreadPoolExecutor: the interpreter joins an executor's
    threads at exit, and a store that hangs must never keep a task process alive.
    The queue is bounded; when it is full the action is dropped and said so.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue(_BACKGROUND_QUEUE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, action: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ett-listener",
                                                daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(action)
        except queue.Full:
            _rate_limited(logging.WARNING, "background-full",
                          "ETT listener: background queue full, an action was dropped")

    def join(self, timeout: float) -> bool:
        """Wait until what was submitted so far has run (at most `timeout`)."""
        done = threading.Event()
        if self._thread is None or not self._thread.is_alive():
            return True
        try:
            self._queue.put(done.set, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            action = self._queue.get()
            try:
                action()
            except Exception as exc:
                _rate_limited(logging.WARNING, f"background-{type(exc).__name__}",
                              "ETT listener: background action failed: %r", exc)

    def after_fork(self) -> None:
        """A forked child (the LocalExecutor forks its workers from the scheduler) has
        neither the parent's thread nor a usable copy of its lock."""
        self._lock = threading.Lock()
        self._thread = None
        self._queue = queue.Queue(_BACKGROUND_QUEUE)


class EttListener:
    """Registered by the `airflow_ett` plugin in every Airflow process.

    `emitter`, `settings` and `rolling` exist for tests; by default: the process's
    emitter, `[ett]`, and its rolling windows.
    """

    def __init__(self, emitter: Callable[[], Emitter] | None = None,
                 settings: Callable[[], EttSettings] = EttSettings.load,
                 rolling: Callable[[], RollingSettings] = RollingSettings.load) -> None:
        self._emitter = emitter or get_emitter
        self._settings = settings
        self._rolling = rolling
        self._settings_cache: EttSettings | None = None
        self._store: Any = None
        self._store_lock = threading.Lock()
        self._background = _Background()
        self._windows: dict[str, WindowReporter] = {}
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._store = None  # a connection pool does not survive a fork: the child makes its own
        self._store_lock = threading.Lock()
        self._background.after_fork()
        self._windows = {}  # their threads stayed in the parent

    # -- plumbing ----------------------------------------------------------------------

    def settings(self) -> EttSettings:
        if self._settings_cache is None:
            self._settings_cache = self._settings()
        return self._settings_cache

    def _enabled(self) -> bool:
        return not self.settings().disabled

    def _get_store(self) -> Any:
        """The process's store, opened on first use; off the hooks' threads only."""
        with self._store_lock:
            if self._store is None:
                from airflow_ett.store import EttStore

                self._store = EttStore(self.settings().store_url)
            return self._store

    def _job_known(self, job: str) -> Any:
        """The store's row for `job`, or None; on the background thread only."""
        return self._get_store().get_job(job)

    def flush(self, timeout: float | None = None) -> bool:
        budget = self.settings().emit_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        joined = self._background.join(budget)
        emitted = self._emitter().flush(max(0.0, deadline - time.monotonic()))
        return joined and emitted

    # -- DAG runs ----------------------------------------------------------------------

    @hookimpl
    @_guarded
    def on_dag_run_running(self, dag_run: Any, msg: str) -> None:
        if not self._enabled():
            return
        dag = getattr(dag_run, "dag", None)
        recording = recording_of(getattr(dag, "tags", None))
        if not recording.recorded:
            return
        dag_id, run_id = str(dag_run.dag_id), str(dag_run.run_id)
        queued = _ts(getattr(dag_run, "queued_at", None)) or _ts(
            getattr(dag_run, "start_date", None))
        conf = getattr(dag_run, "conf", None)
        attrs: dict[str, Any] = {"run_type": _state_name(getattr(dag_run, "run_type", None))}
        if isinstance(conf, dict) and conf:
            attrs["conf"] = _redact({str(k): v for k, v in conf.items()})
        self._emitter().bind(job_id_for(dag_id, run_id)).job_submitted(
            tenant=recording.tenant, model=recording.model, dag_id=dag_id, run_id=run_id,
            attrs=attrs, world_size=recording.gpus, ts=queued)

    @hookimpl
    @_guarded
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        self._dag_run_ended(dag_run, "success")

    @hookimpl
    @_guarded
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        self._dag_run_ended(dag_run, "failed")

    def _dag_run_ended(self, dag_run: Any, status: JobStatus) -> None:
        if not self._enabled():
            return
        dag = getattr(dag_run, "dag", None)
        tags = getattr(dag, "tags", None)
        if tags is not None and not recording_of(tags).recorded:
            return
        job = job_id_for(str(dag_run.dag_id), str(dag_run.run_id))
        ended = _ts(getattr(dag_run, "end_date", None)) or time.time()

        def fallback_end() -> None:
            row = self._job_known(job)
            if row is None:
                return  # not an ETT job
            if row.ended_ts is None:  # its train task never said when it ended
                self._emitter().bind(job).job_ended(status, ts=ended)
            metrics.report_finished_job(job, self._store, self._emitter(),
                                        self.settings().emit_timeout)

        self._background.submit(fallback_end)

    # -- task tries --------------------------------------------------------------------

    @hookimpl
    @_guarded
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        if self._enabled():
            t = _task_try(previous_state, task_instance, "running")
            self._record_try(t, _ts(getattr(task_instance, "start_date", None)))
            self._follow_windows(t)

    @hookimpl
    @_guarded
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        if self._enabled():
            t = _task_try(previous_state, task_instance, "success")
            self._record_try(t, None)
            self._follow_windows(t)

    @hookimpl
    @_guarded
    def on_task_instance_failed(self, previous_state: Any, task_instance: Any,
                                error: BaseException | str | None = None) -> None:
        if not self._enabled():
            return
        # Airflow calls this hook for up_for_retry too: the state tells them apart.
        state = _state_name(getattr(task_instance, "state", None))
        if state not in ("up_for_retry", "failed"):
            state = "failed"
        t = _task_try(previous_state, task_instance, state, error)
        self._record_try(t, None)
        self._follow_windows(t)

    def _follow_windows(self, t: TaskTry) -> None:
        """A train task's try running in this process (the worker's) starts its job's
        rolling-window gauges; its end stops them. Only a thread starts here: the
        reporter reads its settings and the store on that thread."""
        if t.source != "worker" or t.role != "train":
            return
        if t.state == "running":
            if t.recording is not None and t.recording.recorded and t.job not in self._windows:
                reporter = WindowReporter(t.job, self._get_store, self._rolling)
                self._windows[t.job] = reporter
                reporter.start()
        else:
            running = self._windows.pop(t.job, None)
            if running is not None:
                running.stop()

    def stop_windows(self) -> None:
        """Stop every rolling-window reporter of this process (its task is ending)."""
        while self._windows:
            self._windows.popitem()[1].stop()

    def _record_try(self, t: TaskTry, ts: float | None) -> None:
        now = time.time() if ts is None else ts

        def record(on_background: bool = False) -> None:
            emitter = self._emitter().bind(t.job)
            emitter.task_state(t.dag_id, t.task_id, t.state, try_number=t.try_number,
                               map_index=t.map_index, source=t.source, message=t.message,
                               ts=now)
            # The worker reports its own retry; the scheduler, one it killed from outside.
            if t.state == "up_for_retry" and t.retry_delay_s and t.source != "api":
                span = emitter.phase_start("retry_delay", ts=now)
                emitter.phase_end("retry_delay", span, ts=now + t.retry_delay_s)
            if t.source == "scheduler" and t.state in ("up_for_retry", "failed"):
                if on_background:
                    self._close_lost_attempts(t, now)
                else:
                    self._background.submit(lambda: self._close_lost_attempts(t, now))

        if t.recording is not None:
            if t.recording.recorded:
                record()
            return

        # No tags visible here (the API server's task instances): record only for jobs
        # the store knows, which it checks off the request's thread.
        def if_known() -> None:
            if self._job_known(t.job) is not None:
                record(on_background=True)

        self._background.submit(if_known)

    def _close_lost_attempts(self, t: TaskTry, detected: float) -> None:
        """The scheduler failed a try from outside (its worker stopped heartbeating: a
        lost host, a SIGKILLed worker): the trainer attempts still open died with it.
        Each is closed as an infrastructure failure detected now; the retry's attempt
        then restores from the newest checkpoint. On the background thread: it reads
        the store, and an attempt that reported its end meanwhile is left alone."""
        from airflow_ett.ett.open_attempts import open_attempts

        if self._job_known(t.job) is None:
            return
        why = (f"task {t.task_id} try {t.try_number} was failed by the scheduler from "
               "outside (its worker lost, or its heartbeats missed)")
        if t.message:
            why = f"{why}: {t.message}"
        for attempt in open_attempts(self._store.job_events(t.job)):
            self._emitter().bind(t.job, attempt).attempt_ended(
                "failed", "infra", detected_ts=detected, message=why[:MESSAGE_CHARS],
                ts=detected)

    # -- process lifecycle ---------------------------------------------------------------

    @hookimpl
    @_guarded
    def before_stopping(self, component: Any) -> None:
        """The task process exits right after this: deliver what it recorded."""
        self.stop_windows()  # a reschedule ends the try without a hook of its own
        if self._enabled():
            self.flush()
            metrics.emit_emitter_counters(self._emitter().stats())
