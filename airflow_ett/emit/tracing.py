"""A trainer's events as OpenTelemetry spans under the train task's span (docs/tracing.md).

The train task hands its trace context to the trainer as `TRACEPARENT` (and
`TRACESTATE`), the environment carriers of OpenTelemetry's specification; the emitter of
rank 0 then gives every event it records to an `EventTracer` too, which builds the spans
(`ett/trace_spans.py` decides them) and exports them where Airflow's task process exports
its own: the exporter `OTEL_TRACES_EXPORTER` names (Airflow's default `otlp` included),
to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`.

Tracing must never slow or fail training, so: without a sampled `TRACEPARENT`, with
`OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`, or an OTLP exporter with no
endpoint, there is no tracer at all (the emitter pays one environment lookup when it is
made). With one, recording an event is a put on a bounded queue; a thread of the
tracer's own imports OpenTelemetry (an ImportError turns tracing off, logged once),
builds the spans, and a `BatchSpanProcessor` exports them; `flush` and `close` wait at
most their bound (the export goes on on daemon threads that the process does not wait
for). The tracer's provider is its own, never the process's global one.

The first effective step of an attempt after the first needs the job's cursor high-water
mark from earlier attempts (other processes): the tracer reads it from the store (or the
events file) on its thread when the attempt's first progress comes.

An attempt's span has an id both sides derive (`attempt_span_id`: the trace context, the
job and the attempt), so that when a trainer is killed without a word (its attempt span,
exported only when it ends, never leaves the process) the train task exports that span
itself (`end_unreported_attempt`) and the phases the trainer had exported find their
parent.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import queue
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, cast

from airflow_ett.emit._log import logger, rate_limited
from airflow_ett.ett.events import AttemptEnded, AttemptStarted, Event, Progress
from airflow_ett.ett.timeline import to_us
from airflow_ett.ett.trace_spans import (
    ATTEMPT_SPAN,
    Closed,
    Finished,
    Opened,
    SpanAction,
    SpanBuilder,
    high_water_of,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Span, Tracer

TRACEPARENT_ENV: Final = "TRACEPARENT"
TRACESTATE_ENV: Final = "TRACESTATE"
EXPORTER_ENV: Final = "OTEL_TRACES_EXPORTER"
ENDPOINT_ENVS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
ATTEMPT_NUMBER_ENV: Final = "ETT_ATTEMPT_NUMBER"
#: The tracer's `service.name` unless `OTEL_SERVICE_NAME` says otherwise.
SERVICE_NAME: Final = "airflow-ett-trainer"
#: How long `flush` and `close` wait for the spans to be exported, at most.
FLUSH_TIMEOUT_S: Final = 2.0
CLOSE_TIMEOUT_S: Final = 5.0
#: Events waiting for the tracer's thread, at most (more are dropped, counted).
QUEUE_SIZE: Final = 10_000

# W3C trace context: version-traceid-parentid-flags; version ff is invalid, version 00
# has nothing after the flags; an all-zero trace or span id is invalid.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_STOP: Final = object()


@dataclass(frozen=True, slots=True)
class TraceTarget:
    """Where this process's spans go: under `traceparent`, through the exporter named
    `exporter` (an `opentelemetry_traces_exporter` entry point)."""

    traceparent: str
    tracestate: str
    exporter: str
    #: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as the environment given says it: handed to the
    #: exporter when this process's own environment says otherwise (the train task ending
    #: a killed attempt's span for the trainer it started, `end_unreported_attempt`).
    endpoint: str = field(default="", compare=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TraceTarget | None:
        """The target the environment names, or None: tracing is off (why at debug)."""
        parent = environ.get(TRACEPARENT_ENV, "").strip().lower()
        why = _refusal(parent, environ)
        if why is not None:
            logger.debug("ETT traces: off: %s", why)
            return None
        exporter = environ.get(EXPORTER_ENV, "").split(",")[0].strip() or "otlp"
        return cls(parent, environ.get(TRACESTATE_ENV, "").strip(), exporter,
                   environ.get(ENDPOINT_ENVS[0], "").strip())


def _refusal(parent: str, environ: Mapping[str, str]) -> str | None:
    """Why the environment asks for no spans; None when it asks for them."""
    if not parent:
        return f"no {TRACEPARENT_ENV}"
    match = _TRACEPARENT.fullmatch(parent)
    if (match is None or match[1] == "ff" or (match[1] == "00" and match[5])
            or set(match[2]) == {"0"} or set(match[3]) == {"0"}):
        return f"{TRACEPARENT_ENV} = {parent[:80]!r} is not a W3C traceparent"
    if not int(match[4], 16) & 1:
        return "the trace is not sampled"
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "OTEL_SDK_DISABLED"
    exporter = environ.get(EXPORTER_ENV, "").split(",")[0].strip() or "otlp"
    if exporter == "none":
        return f"{EXPORTER_ENV} = none"
    if exporter.startswith("otlp") and not any(environ.get(k) for k in ENDPOINT_ENVS):
        return f"no endpoint ({' or '.join(ENDPOINT_ENVS)})"
    return None


def attempt_span_id(traceparent: str, job: str, attempt: str) -> int:
    """The span id of `attempt`'s span under `traceparent`: the trainer gives it the span
    it opens, and the train task the span it ends for an attempt killed without a word.
    64 bits of a SHA-256 of the three; never 0 (an invalid span id)."""
    digest = hashlib.sha256(f"{traceparent.lower()}\0{job}\0{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


History = Callable[[], Iterable[Event]]
"""The job's events recorded so far (the store's, or the events file's)."""


class EventTracer:
    """Spans from one reporter's events (see the module docstring). `record` never waits
    and never raises; `flush` and `close` wait at most their timeout.

    `attempt_number` 1 (the job's first attempt) has no earlier progress; any other
    reads the job's high-water mark from `history` (None: not known, so no first
    effective step is marked). `exporter`: a span exporter of the caller's (tests),
    instead of the one `target` names. `attempts_only`: the attempts' spans, none of
    their children (the train task ending a killed attempt's span).
    """

    def __init__(self, target: TraceTarget, job: str, *, attempt_number: int | None = 1,
                 history: History | None = None, exporter: SpanExporter | None = None,
                 queue_size: int = QUEUE_SIZE, attempts_only: bool = False) -> None:
        self.target = target
        self.job = job
        self._attempts_only = attempts_only
        self._attempt_number = attempt_number
        self._history = history
        self._exporter = exporter
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._pid = os.getpid()
        self._closing = False
        self._off = False  # OpenTelemetry could not start: events are not even queued
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="ett-traces", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    # -- the caller's side -------------------------------------------------------------

    def record(self, event: Event) -> None:
        """Hand `event` to the tracer's thread (dropped, counted, when its queue is full
        or the tracer closed)."""
        if self._closing or self._off or self._pid != os.getpid():
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            rate_limited(logging.WARNING, "traces-full", "ETT traces: queue full, %d "
                         "event(s) left out of the spans so far", self.dropped)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait (at most `timeout`) until the spans of what was recorded so far are
        exported. False if time ran out."""
        if self._closing or self._pid != os.getpid():
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def stop(self) -> None:
        """Tell the thread to end what is still open and export it, without waiting
        (`close` waits); nothing is recorded after this."""
        if self._closing or self._pid != os.getpid():
            return
        try:
            self._queue.put_nowait(_STOP)
            self._closing = True
        except queue.Full:  # `close` puts it, waiting for room
            pass

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """End what is still open (as not reported), export it and stop, waiting at most
        `timeout` in all. Idempotent."""
        if self._pid != os.getpid():
            return True
        deadline = time.monotonic() + timeout
        if not self._closing:
            try:
                self._queue.put(_STOP, timeout=timeout)
            except queue.Full:
                return False
            self._closing = True
        self._thread.join(max(0.0, deadline - time.monotonic()))
        _LIVE.discard(self)
        return not self._thread.is_alive()

    # -- the tracer's thread -----------------------------------------------------------

    def _run(self) -> None:
        """Take events until the stop; OpenTelemetry is imported with the first one (a
        process that records nothing, a warm spare never used, never imports it)."""
        spans: _Spans | None = None
        builder = SpanBuilder(self.job, high_water_known=self._attempt_number == 1,
                              attempt_attributes=self._attempt_attributes())
        while (item := self._queue.get()) is not _STOP:
            if isinstance(item, threading.Event):  # a flush
                if spans is not None:
                    spans.flush()
                item.set()
                continue
            if spans is None:
                try:
                    spans = _Spans(self.target, self._exporter, self.job)
                except Exception as exc:  # no OpenTelemetry, or an exporter that cannot start
                    logger.warning("ETT traces: off for this process: %s", exc)
                    self._off = True
                    self._drain()
                    return
            try:
                if isinstance(item, Progress) and builder.needs_high_water:
                    self._learn_high_water(builder, item.attempt)
                actions = builder.add(cast("Event", item))
                spans.apply([a for a in actions if not isinstance(a, Finished)]
                            if self._attempts_only else actions)
            except Exception as exc:
                rate_limited(logging.WARNING, f"traces-{type(exc).__name__}", "ETT traces: "
                             "a span was not made: %r", exc)
        if spans is not None:
            try:
                spans.apply(builder.finish(to_us(time.time())))
            finally:
                spans.shutdown()

    def _attempt_attributes(self) -> dict[str, str | int | float | bool]:
        if self._attempt_number is None:
            return {}
        return {"ett.attempt_number": self._attempt_number}

    def _learn_high_water(self, builder: SpanBuilder, attempt: str) -> None:
        """The job's mark before `attempt`, from what earlier attempts recorded."""
        if self._history is None:
            builder.know_high_water(None, known=False)
            return
        try:
            mark = high_water_of(self._history(), besides=attempt)
        except Exception as exc:
            logger.warning("ETT traces: the job's earlier progress cannot be read (%s): "
                           "this attempt's first effective step is not marked", exc)
            builder.know_high_water(None, known=False)
            return
        builder.know_high_water(mark)

    def _drain(self) -> None:
        """Tracing is off: take what comes (answering flushes) until the stop."""
        while (item := self._queue.get()) is not _STOP:
            if isinstance(item, threading.Event):
                item.set()


class _Spans:
    """The OpenTelemetry side, on the tracer's thread: its provider, the parent from the
    target, the attempts' spans while they are open."""

    def __init__(self, target: TraceTarget, exporter: SpanExporter | None, job: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.target, self.job = target, job
        carrier = {"traceparent": target.traceparent}
        if target.tracestate:
            carrier["tracestate"] = target.tracestate
        self.parent: Context = TraceContextTextMapPropagator().extract(carrier)
        if exporter is None:
            exporter = _load_exporter(target.exporter, target.endpoint)
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {
            "service.name": SERVICE_NAME}
        # shutdown_on_exit=False: the provider's own atexit shutdown waits up to 30 s for
        # an exporter; `EventTracer.close` bounds the wait instead.
        self.ids = _preset_ids()
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create(attributes), shutdown_on_exit=False,
            id_generator=self.ids)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer: Tracer = self.provider.get_tracer("airflow_ett")
        self.open: dict[str, Span] = {}
        self.contexts: dict[str, Context] = {}

    def apply(self, actions: list[SpanAction]) -> None:
        for action in actions:
            if isinstance(action, Opened):
                self._open(action)
            elif isinstance(action, Finished):
                span = self.tracer.start_span(
                    action.name, context=self.contexts.get(action.attempt or "", self.parent),
                    start_time=action.start_us * 1000, attributes=action.attributes)
                span.end(end_time=action.end_us * 1000)
            else:
                self._close(action)

    def _open(self, action: Opened) -> None:
        from opentelemetry.trace import set_span_in_context

        self.ids.preset = attempt_span_id(self.target.traceparent, self.job, action.attempt)
        span = self.tracer.start_span(ATTEMPT_SPAN, context=self.parent,
                                      start_time=action.start_us * 1000,
                                      attributes=action.attributes)
        self.open[action.attempt] = span
        self.contexts[action.attempt] = set_span_in_context(span)

    def _close(self, action: Closed) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.open.pop(action.attempt, None)
        if span is None:
            return
        span.set_attributes(action.attributes)
        for note in action.notes:
            span.add_event(note.name, note.attributes, timestamp=note.at_us * 1000)
        if action.error is not None:
            span.set_status(Status(StatusCode.ERROR, action.error))
        span.end(end_time=action.end_us * 1000)

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()


def _preset_ids() -> _PresetIds:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PresetIds(RandomIdGenerator):
        """Random ids, but the next span id once `preset` (the attempt span's) is set."""

        preset: int | None = None

        def generate_span_id(self) -> int:
            preset, self.preset = self.preset, None
            return preset if preset is not None else super().generate_span_id()

    return cast("_PresetIds", PresetIds())


if TYPE_CHECKING:
    class _PresetIds(IdGenerator):
        preset: int | None


def end_unreported_attempt(environ: Mapping[str, str], job: str, attempt: str, *,
                           started: float, ended: AttemptEnded,
                           timeout: float = CLOSE_TIMEOUT_S) -> bool:
    """Export the span of an attempt that ended without a word (SIGKILL, the OOM
    killer), as its trainer would have: the same id (`attempt_span_id`), from `started`
    to the end the train task recorded (`ended`, with its error). `environ` is what the
    trainer was given (its trace context and exporter); nothing without a context. False
    when the span could not be exported within `timeout`."""
    target = TraceTarget.from_environ(environ)
    if target is None:
        return True
    tracer = EventTracer(target, job, attempt_number=None, history=None, attempts_only=True)
    tracer.record(AttemptStarted(id=f"{ended.id}.start", job=job, ts=started,
                                 attempt=attempt))
    tracer.record(ended)
    return tracer.close(timeout)


def _load_exporter(name: str, endpoint: str = "") -> SpanExporter:
    """The span exporter `name` (an `opentelemetry_traces_exporter` entry point, as
    Airflow loads its own: `otlp` is OTLP/gRPC, `otlp_proto_http` OTLP/HTTP, `console`);
    it reads its endpoint, headers and timeout from the `OTEL_EXPORTER_OTLP_*`
    environment, except `endpoint` when given and not already this process's own."""
    import inspect
    from importlib.metadata import entry_points

    found = next(iter(entry_points(group="opentelemetry_traces_exporter", name=name)), None)
    if found is None:
        raise RuntimeError(f"{EXPORTER_ENV} = {name!r}: no such span exporter is installed")
    factory = found.load()
    kwargs = {}
    if endpoint and endpoint != os.environ.get(ENDPOINT_ENVS[0], "").strip():
        try:
            takes = "endpoint" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            takes = False
        if takes:
            kwargs["endpoint"] = endpoint
    exporter: SpanExporter = factory(**kwargs)
    return exporter


def tracer_from_environ(job: str | None, attempt: str | None, *, rank: int,
                        history: Callable[[], History | None],
                        environ: Mapping[str, str] | None = None) -> EventTracer | None:
    """The tracer the environment asks this process for, or None (the common case: no
    `TRACEPARENT`). Rank 0 alone traces: its events are the attempt's timeline, as they
    are the attribution's. `history` is asked for the job's recorded events only when
    tracing is on."""
    env = os.environ if environ is None else environ
    if rank or job is None or attempt is None or not env.get(TRACEPARENT_ENV):
        return None
    target = TraceTarget.from_environ(env)
    if target is None:
        return None
    number = env.get(ATTEMPT_NUMBER_ENV, "").strip()  # not given: look the mark up
    return EventTracer(target, job, attempt_number=int(number) if number.isdigit() else None,
                       history=history())


_LIVE: weakref.WeakSet[EventTracer] = weakref.WeakSet()


def _close_all() -> None:
    """At exit: every tracer not closed yet, each within its bound."""
    for tracer in list(_LIVE):
        tracer.close()


atexit.register(_close_all)


def store_history(url: str, job: str) -> History:
    """The job's events in the ETT store at `url` (the store imported when first read)."""

    def read() -> list[Event]:
        from airflow_ett.store import EttStore

        with EttStore(url) as store:
            return store.job_events(job)

    return read
