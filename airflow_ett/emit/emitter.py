"""What trainers, operators and listeners call to record a job's timeline.

Every method builds one event and hands it to the background writer: a few
microseconds, no I/O, no lock on the common path, and never an exception (the task being
observed matters more than the observation). Problems are logged, rate-limited, on the
`airflow_ett.emit` logger.

`get_emitter()` is the process-wide instance from `[ett]` settings and the `ETT_JOB_ID` /
`ETT_ATTEMPT_ID` environment (what the train operator sets for the trainer). A listener
that reports for many jobs from one process uses `get_emitter().bind(job_id, attempt_id)`:
views share one writer, its threads and its spool file.

Every event recorded passes `_hand_over`, which is also where a trainer's events become
trace spans: when the train task gave the process a trace context (`TRACEPARENT`), rank
0's emitter hands each event to its `EventTracer` as well (`emit/tracing.py`,
docs/tracing.md), so every trainer that reports through an emitter (ours, every adapter)
gets the spans. Without it the emitter never imports the tracing module.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from airflow_ett.emit._log import logger, rate_limited
from airflow_ett.emit.sinks import EventSink, JsonlSink, StoreSink
from airflow_ett.emit.worker import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LINGER,
    DEFAULT_QUEUE_SIZE,
    BackgroundWriter,
    EmitterStats,
)
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    AttemptStatus,
    CheckpointSaved,
    ComponentName,
    Event,
    FailureCause,
    JobEnded,
    JobStatus,
    JobSubmitted,
    ModelPublished,
    PhaseEnded,
    PhaseStarted,
    Progress,
    RankSteps,
    TaskSource,
    TaskStateChanged,
    with_rank,
)
from airflow_ett.settings import EttSettings

if TYPE_CHECKING:
    from airflow_ett.emit.tracing import EventTracer, History

JOB_ENV: Final = "ETT_JOB_ID"
ATTEMPT_ENV: Final = "ETT_ATTEMPT_ID"

_NULL_PHASE: Final = nullcontext("")
#: The trace context the train task gives its trainer (`emit.tracing.TRACEPARENT_ENV`),
#: looked up here so that an emitter without it never imports the tracing module.
_TRACEPARENT_ENV: Final = "TRACEPARENT"

#: What a rank other than 0 reports: its own phases, its attempt's start and end, and its
#: own step times (decision 0033). Progress and checkpoints are the job's (every rank
#: steps and saves together), so rank 0 alone sends them; counting each rank's would
#: multiply them (decision 0017).
RANK_OWN_EVENTS: Final = (PhaseStarted, PhaseEnded, AttemptStarted, AttemptEnded, RankSteps)


class _Phase:
    """The `phase()` context manager: a class, not a generator, to keep it cheap."""

    __slots__ = ("_component", "_emitter", "_name", "span")

    def __init__(self, emitter: Emitter, name: str, component: ComponentName | None) -> None:
        self._emitter = emitter
        self._name = name
        self._component = component
        self.span = ""

    def __enter__(self) -> str:
        self.span = self._emitter._phase_event(PhaseStarted, self._name, self._component, None,
                                               None)
        return self.span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._emitter._phase_event(PhaseEnded, self._name, self._component, self.span, None)


class Emitter:
    """Records events for one job (and attempt) through a background writer.

    Arguments left out come from `EttSettings.load()` and the environment. A `sink`
    object or URL replaces the configured store (tests, other transports); a URL is
    better where the process forks, since a forked child then builds its own store
    connection, while a sink object is shared as is. With `disabled` (or
    `[ett] disabled = true`) every method returns at once.

    A process that leaves through `os._exit` (multiprocessing children, some task
    runners) skips the atexit flush: call `flush()` at its last hook.

    `rank`: the process's rank in a multi-process attempt. Rank 0 (the default) reports
    everything; another rank stamps its events with its rank and reports only
    `RANK_OWN_EVENTS`, dropping the rest as it records them, so that the spool and the
    store hold each event stamped.

    Rank 0 of an attempt whose environment carries a trace context (`TRACEPARENT`) also
    turns its events into trace spans (`emit/tracing.py`); `tracing` says whether it does.
    `flush` and `close` then wait for those too, at most `tracing.FLUSH_TIMEOUT_S` and
    `tracing.CLOSE_TIMEOUT_S` more.
    """

    def __init__(
        self,
        job_id: str | None = None,
        attempt_id: str | None = None,
        *,
        sink: EventSink | str | None = None,
        settings: EttSettings | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        emit_timeout: float | None = None,
        disabled: bool | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        linger: float = DEFAULT_LINGER,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        replay_on_start: bool = True,
        rank: int = 0,
    ) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"rank must be an int >= 0, got {rank!r}")
        self._rank = rank
        self._job = job_id if job_id is not None else os.environ.get(JOB_ENV) or None
        self._attempt = (attempt_id if attempt_id is not None
                         else os.environ.get(ATTEMPT_ENV) or None)
        self._owner = True
        self._open_spans: dict[str, list[tuple[str, ComponentName | None]]] = {}
        self._spans_lock = threading.Lock()
        self._writer: BackgroundWriter | None = None
        self._tracer: EventTracer | None = None
        try:
            self._writer = _build_writer(sink, settings, spool_dir, emit_timeout, disabled,
                                         batch_size, linger, queue_size, replay_on_start)
        except Exception as exc:
            logger.error("ETT emit: cannot start, recording is off for this emitter: %s", exc)
        if self._writer is not None and os.environ.get(_TRACEPARENT_ENV):
            self._tracer = _start_tracer(self._job, self._attempt, rank, sink, settings)

    # -- identity ----------------------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        return self._job

    @property
    def attempt_id(self) -> str | None:
        return self._attempt

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    @property
    def writer(self) -> BackgroundWriter | None:
        return self._writer

    @property
    def tracing(self) -> bool:
        """Whether this emitter also makes trace spans of its events."""
        return self._tracer is not None

    def bind(self, job_id: str | None = None, attempt_id: str | None = None) -> Emitter:
        """A view for another job/attempt sharing this emitter's writer (no new threads).

        Closing a view only flushes; the writer belongs to the emitter that made it.
        """
        view = Emitter.__new__(Emitter)
        view._job = job_id if job_id is not None else self._job
        view._attempt = attempt_id if attempt_id is not None else self._attempt
        view._owner = False
        view._rank = self._rank
        view._open_spans = {}
        view._spans_lock = threading.Lock()
        view._writer = self._writer
        view._tracer = None  # spans are the process's own attempt's: not a view's
        return view

    def new_id(self) -> str:
        """A fresh event id, unique across processes (for events built by the caller)."""
        writer = self._writer
        return writer.ids() if writer is not None else ""

    # -- recording ---------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Record an event built by the caller (its own `id`, `job`, `ts`)."""
        writer = self._writer
        if writer is None:
            return
        try:
            self._hand_over(writer, event)
        except Exception as exc:
            _swallow(exc)

    def _hand_over(self, writer: BackgroundWriter, event: Event) -> None:
        """Every recorded event passes here: a rank other than 0 keeps its own, stamped."""
        if self._rank:
            if not isinstance(event, RANK_OWN_EVENTS):
                return
            event = with_rank(event, self._rank)
        writer.put(event)
        tracer = self._tracer
        if tracer is not None:
            tracer.record(event)  # a put on its queue; never raises

    def _record(self, cls: type[Any], ts: float | None, *, per_attempt: bool,
                **fields: Any) -> None:
        """Build one event of this job (and attempt) and hand it to the writer.

        The one place that guards every recording call: a disabled emitter returns at
        once, missing ids are reported (rate-limited), and nothing ever raises.
        """
        writer, job = self._writer, self._job
        if writer is None:
            return
        if job is None or (per_attempt and self._attempt is None):
            return _missing_ids()
        try:
            if per_attempt:
                fields["attempt"] = self._attempt
            self._hand_over(writer, cls(id=writer.ids(), job=job,
                                        ts=time.time() if ts is None else ts, **fields))
        except Exception as exc:
            _swallow(exc)

    def job_submitted(self, *, tenant: str = "default", model: str = "",
                      dag_id: str | None = None, run_id: str | None = None,
                      attrs: Mapping[str, Any] | None = None, world_size: int = 1,
                      ts: float | None = None) -> None:
        self._record(JobSubmitted, ts, per_attempt=False, tenant=tenant, model=model,
                     dag_id=dag_id, run_id=run_id, attrs=dict(attrs) if attrs else {},
                     world_size=world_size)

    def attempt_started(self, *, host: str | None = None, ts: float | None = None) -> None:
        self._record(AttemptStarted, ts, per_attempt=True,
                     host=host if host is not None else _hostname())

    def attempt_ended(self, status: AttemptStatus, cause: FailureCause | None = None,
                      detected_ts: float | None = None, exit_code: int | None = None,
                      message: str | None = None, *, ts: float | None = None) -> None:
        self._record(AttemptEnded, ts, per_attempt=True, status=status, cause=cause,
                     detected_ts=detected_ts, exit_code=exit_code, message=message)

    def phase(self, name: str, component: ComponentName | None = None
              ) -> AbstractContextManager[str]:
        """`with emitter.phase("model_creation"):` pairs start and end by a unique span.

        The end is recorded however the block exits. Each call has its own span, so the
        same phase may run nested or in several threads at once (parallel init).
        """
        if self._writer is None:
            return _NULL_PHASE
        return _Phase(self, name, component)

    def phase_start(self, name: str, component: ComponentName | None = None, *,
                    span: str | None = None, ts: float | None = None) -> str:
        """Start a phase that `phase_end` closes later; returns its span.

        Pass `span` yourself when start and end happen in different processes.
        """
        span = self._phase_event(PhaseStarted, name, component, span, ts)
        if span:
            with self._spans_lock:
                self._open_spans.setdefault(name, []).append((span, component))
        return span

    def phase_end(self, name: str, span: str | None = None,
                  component: ComponentName | None = None, *, ts: float | None = None) -> None:
        """End a phase; without `span`, the most recent one of that name started here.

        The component declared at the start carries over, so an unregistered phase needs
        it only once.
        """
        if self._writer is None:
            return
        with self._spans_lock:
            spans = self._open_spans.get(name)
            if spans:
                index = len(spans) - 1
                if span is not None:
                    index = next((i for i, (s, _) in enumerate(spans) if s == span), -1)
                if index >= 0:
                    span, declared = spans.pop(index)
                    component = component if component is not None else declared
                if not spans:
                    del self._open_spans[name]
        self._phase_event(PhaseEnded, name, component, span or "", ts)

    def _phase_event(self, cls: type[PhaseStarted] | type[PhaseEnded], name: str,
                     component: ComponentName | None, span: str | None,
                     ts: float | None) -> str:
        writer, job = self._writer, self._job
        if writer is None:
            return ""
        if job is None:
            _missing_ids()
            return ""
        try:
            event_id = writer.ids()
            if span is None:
                span = event_id  # unique already: the start event's own id
            self._hand_over(writer, cls(id=event_id, job=job,
                                        ts=time.time() if ts is None else ts, phase=name,
                                        attempt=self._attempt, span=span,
                                        component=component))
            return span
        except Exception as exc:
            _swallow(exc)
            return span or ""

    def progress(self, step_start: int, step_end: int, cursor_start: int, cursor_end: int,
                 start_ts: float, end_ts: float | None = None,
                 loss: float | None = None, *, next_save_ts: float | None = None) -> None:
        """Steps `[step_start, step_end)` read `[cursor_start, cursor_end)` from `start_ts`;
        `next_save_ts`, when the next checkpoint save is expected to begin (if known).

        The hot path (once per step or per few steps): one Struct and an append.
        """
        self._record(Progress, end_ts, per_attempt=True, start_ts=start_ts,
                     step_start=step_start, step_end=step_end, cursor_start=cursor_start,
                     cursor_end=cursor_end, loss=loss, next_save_ts=next_save_ts)

    def rank_steps(self, step_start: int, step_end: int, start_ts: float, busy_s: float,
                   wait_s: float, *, ts: float | None = None) -> None:
        """This rank's own time over steps `[step_start, step_end)` since `start_ts`:
        `busy_s` its own work, `wait_s` waiting for the other ranks (every rank sends it)."""
        self._record(RankSteps, ts, per_attempt=True, start_ts=start_ts,
                     step_start=step_start, step_end=step_end, busy_s=busy_s, wait_s=wait_s)

    def checkpoint(self, step: int, cursor: int, start_ts: float, blocking_s: float,
                   total_s: float, bytes: int = 0, final: bool = False, *,
                   ts: float | None = None) -> None:
        """A checkpoint committed now (or at `ts`); `blocking_s` held up the train loop."""
        self._record(CheckpointSaved, ts, per_attempt=True, start_ts=start_ts, step=step,
                     cursor=cursor, blocking_s=blocking_s, total_s=total_s, bytes=bytes,
                     final=final)

    def job_ended(self, status: JobStatus, *, ts: float | None = None) -> None:
        self._record(JobEnded, ts, per_attempt=False, status=status)

    def task_state(self, dag_id: str, task_id: str, state: str, *, try_number: int = 0,
                   map_index: int = -1, source: TaskSource = "worker",
                   message: str | None = None, ts: float | None = None) -> None:
        """An Airflow task try changed state (what the listeners record)."""
        self._record(TaskStateChanged, ts, per_attempt=False, dag_id=dag_id, task_id=task_id,
                     state=state, try_number=try_number, map_index=map_index, source=source,
                     message=message)

    def model_published(self, uri: str | None = None, *, ts: float | None = None) -> None:
        self._record(ModelPublished, ts, per_attempt=False, uri=uri)

    # -- delivery ----------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (at most `timeout`, default `emit_timeout`) until all recorded so far is
        in the store or fsync'd in the spool. False if time ran out (the rest is spooled).
        """
        writer = self._writer
        if writer is None:
            return True
        try:
            return writer.flush(timeout)
        except Exception as exc:
            _swallow(exc)
            return False
        finally:
            self._flush_spans(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush and stop the writer (a view only flushes). Idempotent."""
        writer = self._writer
        if writer is None:
            return True
        tracer = self._tracer
        if tracer is not None:
            tracer.stop()  # its thread ends its spans while the writer delivers
        try:
            return writer.close(timeout) if self._owner else writer.flush(timeout)
        except Exception as exc:
            _swallow(exc)
            return False
        finally:
            if tracer is not None:
                from airflow_ett.emit.tracing import CLOSE_TIMEOUT_S

                _bounded(tracer.close, CLOSE_TIMEOUT_S, timeout)

    def _flush_spans(self, timeout: float | None) -> None:
        tracer = self._tracer
        if tracer is not None:
            from airflow_ett.emit.tracing import FLUSH_TIMEOUT_S

            _bounded(tracer.flush, FLUSH_TIMEOUT_S, timeout)

    def stats(self) -> EmitterStats:
        writer = self._writer
        return writer.stats if writer is not None else EmitterStats()

    def delivery(self) -> dict[str, Any]:
        """What this process's writer did with the events it was given, for a reconciler
        to count against the store: every id it made starts with `id_prefix`; `sent`
        reached the store or a spool that is replayed into it; `lost` did not (dropped,
        or rejected as invalid). Exact once the writer is closed."""
        writer = self._writer
        if writer is None:
            return {"id_prefix": None, "sent": 0, "lost": 0}
        stats = writer.stats
        return {"id_prefix": writer.ids.prefix,
                "sent": stats.written + stats.spooled + stats.overflowed,
                "lost": stats.dropped + stats.rejected}

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "on" if self._writer is not None else "off"
        return f"Emitter(job={self._job!r}, attempt={self._attempt!r}, {state})"


def _bounded(wait: Callable[[float], bool], most: float, timeout: float | None) -> None:
    """`wait(t)` for the tracer, `t` at most `most` (and `timeout`, when given)."""
    try:
        wait(most if timeout is None else min(most, max(timeout, 0.0)))
    except Exception as exc:
        _swallow(exc)


def _start_tracer(job: str | None, attempt: str | None, rank: int,
                  sink: EventSink | str | None, settings: EttSettings | None
                  ) -> EventTracer | None:
    """The tracer the environment asks for (docs/tracing.md), or None; never raises.
    It reads the job's earlier progress where this emitter writes: its events file, or
    the store (another sink object: not known)."""

    def history() -> History | None:
        from airflow_ett.emit.tracing import store_history

        if isinstance(sink, JsonlSink):
            return sink.read
        if sink is not None and not isinstance(sink, str):
            return None
        assert job is not None  # tracer_from_environ asks only with a job
        url = sink if sink is not None else (settings or EttSettings.load()).store_url
        return store_history(url, job)

    try:
        from airflow_ett.emit.tracing import tracer_from_environ

        return tracer_from_environ(job, attempt, rank=rank, history=history)
    except Exception as exc:
        logger.warning("ETT traces: off for this process: %s", exc)
        return None


def _missing_ids() -> None:
    rate_limited(logging.WARNING, "missing-ids", "ETT emit: no job or attempt id (pass "
                 "job_id/attempt_id, or set %s/%s); event not recorded", JOB_ENV, ATTEMPT_ENV)


def _swallow(exc: Exception) -> None:
    rate_limited(logging.ERROR, f"emit-{type(exc).__name__}", "ETT emit: event not recorded: "
                 "%r", exc, exc_info=exc)


_HOST: str | None = None


def _hostname() -> str:
    global _HOST
    if _HOST is None:
        _HOST = socket.gethostname()
    return _HOST


def _build_writer(sink: EventSink | str | None, settings: EttSettings | None,
                  spool_dir: str | os.PathLike[str] | None, emit_timeout: float | None,
                  disabled: bool | None, batch_size: int, linger: float, queue_size: int,
                  replay_on_start: bool) -> BackgroundWriter | None:
    needs_settings = disabled is None or spool_dir is None or emit_timeout is None or (
        sink is None)
    if settings is None and needs_settings:
        settings = EttSettings.load()
    if disabled is None:
        assert settings is not None
        disabled = settings.disabled
    if disabled:
        return None
    if spool_dir is None:
        assert settings is not None
        spool_dir = settings.spool_dir
    if emit_timeout is None:
        assert settings is not None
        emit_timeout = settings.emit_timeout
    factory: Callable[[], EventSink]
    if sink is None or isinstance(sink, str):
        if sink is None:
            assert settings is not None
            sink = settings.store_url
        # A factory, not a store: a forked child must build its own (a database
        # connection pool does not survive a fork).
        factory = partial(StoreSink, sink)
    else:
        factory = partial(_same, sink)
    return BackgroundWriter(factory, Path(spool_dir), emit_timeout=emit_timeout,
                            batch_size=batch_size, linger=linger, queue_size=queue_size,
                            replay_on_start=replay_on_start)


def _same(sink: EventSink) -> EventSink:
    return sink


_default: Emitter | None = None
_default_lock = threading.Lock()


def get_emitter() -> Emitter:
    """The process-wide emitter, built on first use from settings and environment."""
    global _default
    emitter = _default
    if emitter is None:
        with _default_lock:
            if _default is None:
                _default = Emitter()
            emitter = _default
    return emitter


def reset_default_emitter(close: bool = True) -> None:
    """Forget the process-wide emitter (tests; a changed configuration)."""
    global _default
    with _default_lock:
        emitter, _default = _default, None
    if emitter is not None and close:
        emitter.close()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
