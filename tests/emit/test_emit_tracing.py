"""A trainer's events as trace spans (airflow_ett/emit/tracing.py): a bare `job()` loop
run as trainer processes (tests/emit/_traced_loop.py: an attempt that fails, then its
recovery), given a trace context as the train task gives it, against the OpenTelemetry
SDK's in-memory exporter and a real OTLP/HTTP receiver: the spans nest under the given
parent, start and end at the events' times, and last what the ETT breakdown of the same
events says. Without a context, or without OpenTelemetry, nothing changes; a collector
that never answers never holds the trainer up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from airflow_ett.adapters import job
from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.emit import tracing as tracing_module
from airflow_ett.emit.tracing import EventTracer, TraceTarget
from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.events import Event, PhaseEnded, PhaseStarted
from airflow_ett.ett.timeline import to_us
from tests.emit.conftest import Destination
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

LOOP = str(Path(__file__).with_name("_traced_loop.py"))
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
JOB = "traced__run1"
FAIL_AT, PER_STEP = 12, 10


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """The train task's environment for its trainer, tracing aside."""
    for name in ("TRACEPARENT", "TRACESTATE", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_SERVICE_NAME", "ETT_EVENTS_FILE"):
        monkeypatch.delenv(name, raising=False)
    return {"ETT_JOB_ID": JOB, "AIRFLOW__ETT__SPOOL_DIR": str(tmp_path / "spool")}


def traced(endpoint: str) -> dict[str, str]:
    return {"TRACEPARENT": TRACEPARENT, "OTEL_TRACES_EXPORTER": "otlp_proto_http",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}


def run_job(env: dict[str, str], submit: Emitter) -> None:
    """Submission (the scheduler's part), then attempt 1 failing after step 12 and
    attempt 2 restoring step 10, each a process, as the train task launches them."""
    submit.job_submitted(ts=time.time())
    submit.close()
    for number, args in ((1, ["0", str(FAIL_AT), "20"]), (2, ["10", "0", "20"])):
        proc = subprocess.run(
            [sys.executable, LOOP, *args], capture_output=True, text=True, timeout=120,
            env={**os.environ, **env, "ETT_ATTEMPT_ID": str(number),
                 "ETT_ATTEMPT_NUMBER": str(number)}, check=False)
        assert proc.returncode == (1 if number == 1 else 0), proc.stderr[-3000:]


def by_label(spans: list[ReceivedSpan]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for s in spans:
        if "ett.phase" in s.attributes:
            assert (s.end_ns - s.start_ns) % 1000 == 0  # the breakdown's microseconds
            totals[s.attributes["ett.phase"]] += (s.end_ns - s.start_ns) // 1000
    return dict(totals)


def check_spans(spans: list[ReceivedSpan], events: list[Event],
                result: JobAttribution) -> dict[str, ReceivedSpan]:
    """The tree under the given parent, its times against the events and the breakdown;
    returns the attempts' spans by attempt id."""
    assert {s.trace_id for s in spans} == {TRACE}
    attempts = {s.attributes["ett.attempt"]: s for s in spans if s.name == "ett.attempt"}
    assert set(attempts) == {"1", "2"}
    assert all(s.parent == PARENT for s in attempts.values())
    ids = {s.span_id: a for a, s in attempts.items()}
    for s in spans:
        if s.name != "ett.attempt":  # every other span is its attempt's child
            assert ids[s.parent] == s.attributes["ett.attempt"], s
    # each phase span starts and ends at its events' times
    starts = {(e.attempt, e.phase): e.ts for e in events if isinstance(e, PhaseStarted)}
    ends = {(e.attempt, e.phase): e.ts for e in events if isinstance(e, PhaseEnded)}
    checked = 0
    for s in spans:
        key = (s.attributes.get("ett.attempt"), s.attributes.get("ett.phase"))
        if key in starts:
            assert (s.start_ns, s.end_ns) == (to_us(starts[key]) * 1000,
                                              to_us(ends[key]) * 1000)
            checked += 1
    assert checked == len(starts) >= 6  # trainer_init, model_creation, restore: twice
    assert by_label(spans) == result.phases_raw_us
    # the first effective steps: where TTS ends, and where the recovery's TTR ends
    firsts = {s.attributes["ett.attempt"]: s for s in spans
              if s.name == "ett.first_effective_step"}
    assert firsts["1"].start_ns == (to_us(result.submitted_at) + result.tts_us) * 1000
    (failure,) = result.failures
    assert failure.ttr_us is not None
    assert firsts["2"].start_ns == (to_us(failure.at) + failure.ttr_us) * 1000
    assert firsts["2"].attributes["ett.high_water"] == FAIL_AT * PER_STEP
    (replay,) = [s for s in spans if s.name == "ett.replay"]
    assert replay.end_ns == firsts["2"].start_ns > replay.start_ns
    assert attempts["1"].status_code == 2 and attempts["2"].status_code != 2
    assert "injected at step 12" in attempts["1"].status_message
    assert [name for name, _, _ in attempts["1"].events] == ["ett.failure"]
    return attempts


def test_a_job_s_events_become_spans_under_the_given_parent(
        job_env: dict[str, str], tmp_path: Path) -> None:
    """The events of the two attempts, as they wrote them to their events file, fed to a
    tracer with the SDK's in-memory exporter in that order."""
    events_file = tmp_path / "events.jsonl"
    run_job({**job_env, "ETT_EVENTS_FILE": str(events_file)},
            Emitter(JOB, sink=JsonlSink(events_file), replay_on_start=False))
    events = JsonlSink(events_file).read()  # in the order written
    exporter = InMemorySpanExporter()
    tracer = EventTracer(TraceTarget(TRACEPARENT, "", "unused"), JOB, attempt_number=None,
                         history=lambda: (), exporter=exporter)
    for event in events:
        tracer.record(event)
    assert tracer.close()
    spans = [ReceivedSpan(
        trace_id=f"{s.context.trace_id:032x}", span_id=f"{s.context.span_id:016x}",
        parent=f"{s.parent.span_id:016x}" if s.parent else "", name=s.name,
        start_ns=s.start_time or 0, end_ns=s.end_time or 0,
        attributes=dict(s.attributes or {}), service="",
        events=tuple((e.name, e.timestamp, dict(e.attributes or {})) for e in s.events),
        status_code=s.status.status_code.value, status_message=s.status.description or "")
        for s in exporter.get_finished_spans()]
    check_spans(spans, events, attribute_job(events))


def test_the_trainer_s_emitter_exports_its_spans_over_otlp_http(
        job_env: dict[str, str], dest: Destination) -> None:
    """The environment the train task gives: each attempt's emitter finds the context
    and exports its spans to a collector; the recovery reads the first attempt's
    high-water mark from the store its events went to."""
    store = ({"ETT_EVENTS_FILE": dest.spec[len("jsonl:"):]} if dest.spec.startswith("jsonl:")
             else {"AIRFLOW__ETT__STORE_URL": dest.spec})
    with OtlpReceiver() as receiver:
        run_job({**job_env, **store, **traced(receiver.endpoint)},
                Emitter(JOB, sink=dest.sink(), replay_on_start=False))
        spans = receiver.wait_for("both attempts", lambda found: sum(
            s.name == "ett.attempt" for s in found) == 2, timeout=30.0)
    events = dest.events(JOB)
    attempts = check_spans(spans, events, attribute_job(events))
    assert {s.service for s in spans} == {"airflow-ett-trainer"}
    assert {a: s.attributes["ett.attempt_number"] for a, s in attempts.items()} == {
        "1": 1, "2": 2}


@pytest.mark.parametrize(("env", "why"), [
    ({}, "no TRACEPARENT"),
    ({"TRACEPARENT": f"00-{TRACE}-{PARENT}-00"}, "not sampled"),
    ({"TRACEPARENT": "00-xyz"}, "not a W3C traceparent"),
    ({"TRACEPARENT": f"00-{'0' * 32}-{PARENT}-01"}, "not a W3C traceparent"),
    ({"TRACEPARENT": TRACEPARENT, "OTEL_TRACES_EXPORTER": "none"}, "= none"),
    ({"TRACEPARENT": TRACEPARENT, "OTEL_SDK_DISABLED": "true"}, "OTEL_SDK_DISABLED"),
    ({"TRACEPARENT": TRACEPARENT}, "no endpoint"),
])
def test_no_spans_unless_the_environment_asks_for_them(
        env: dict[str, str], why: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="airflow_ett.emit")
    assert TraceTarget.from_environ(env) is None
    assert why in caplog.text


def test_the_target_is_the_exporter_airflow_would_use() -> None:
    base = {"TRACEPARENT": TRACEPARENT.upper(), "TRACESTATE": "k=v",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert TraceTarget.from_environ(base) == TraceTarget(TRACEPARENT, "k=v", "otlp")
    random_id = f"00-{TRACE}-{PARENT}-03"  # sampled, and a random trace id (W3C level 2)
    assert TraceTarget.from_environ({**base, "TRACEPARENT": random_id}) == (
        TraceTarget(random_id, "k=v", "otlp"))
    assert TraceTarget.from_environ({**base, "OTEL_TRACES_EXPORTER": "otlp_proto_http"}) == (
        TraceTarget(TRACEPARENT, "k=v", "otlp_proto_http"))
    # an exporter that is not OTLP needs no endpoint
    assert TraceTarget.from_environ({"TRACEPARENT": TRACEPARENT,
                                     "OTEL_TRACES_EXPORTER": "console"}) == (
        TraceTarget(TRACEPARENT, "", "console"))


def test_only_rank_0_of_a_traced_attempt_traces(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in traced("http://127.0.0.1:9/v1/traces").items():
        monkeypatch.setenv(name, value)
    sink = JsonlSink(tmp_path / "events.jsonl")
    for rank, attempt, expected in ((0, "1", True), (1, "1", False), (0, None, False)):
        emitter = Emitter(JOB, attempt, sink=sink, spool_dir=tmp_path / "spool", rank=rank,
                          replay_on_start=False)
        assert emitter.tracing is expected
        assert emitter.bind(JOB, "2").tracing is False
        emitter.close(1.0)
    monkeypatch.delenv("TRACEPARENT")
    assert not Emitter(JOB, "1", sink=sink, spool_dir=tmp_path / "spool").tracing


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, job_env: dict[str, str],
               dest: Destination) -> Iterator[Destination]:
    """This process as the trainer (`job()` takes SIGTERM in the main thread: pytest gets
    its own handler back)."""
    for name, value in job_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ETT_ATTEMPT_ID", "1")
    monkeypatch.setenv("AIRFLOW__ETT__STORE_URL", dest.spec)
    if dest.spec.startswith("jsonl:"):
        monkeypatch.setenv("ETT_EVENTS_FILE", dest.spec[len("jsonl:"):])
    before = signal.getsignal(signal.SIGTERM)
    yield dest
    signal.signal(signal.SIGTERM, before)


def short_attempt() -> bool:
    with job() as ett:
        with ett.phase("model_creation"):
            time.sleep(0.01)
        for step in range(1, 7):
            ett.begin_step()
            time.sleep(0.005)
            ett.step(step)
        return ett.emitter.tracing


def test_without_opentelemetry_the_job_runs_and_records_as_before(
        monkeypatch: pytest.MonkeyPatch, in_process: Destination,
        caplog: pytest.LogCaptureFixture) -> None:
    with OtlpReceiver() as receiver:
        for name, value in traced(receiver.endpoint).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # not importable
        started = time.monotonic()
        assert short_attempt()
        assert time.monotonic() - started < 5.0
        assert receiver.spans() == [] and receiver.requests == 0
    (row,) = attribute_job(in_process.events(JOB)).attempts
    assert row.status == "success"
    assert "ETT traces: off for this process" in caplog.text


def test_a_collector_that_never_answers_never_holds_the_trainer_up(
        monkeypatch: pytest.MonkeyPatch, in_process: Destination) -> None:
    """A collector that takes the connection and never replies: leaving waits the
    tracer's bound, not the exporter's timeout."""
    monkeypatch.setattr(tracing_module, "CLOSE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(tracing_module, "FLUSH_TIMEOUT_S", 0.3)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        for name, value in traced(f"http://127.0.0.1:{silent.getsockname()[1]}"
                                  "/v1/traces").items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # exporting while it trains
        # the exporter's own wait, longer than the tracer's bound (not the default 10 s,
        # so that its thread does not outlive the test by long)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "4")
        started = time.monotonic()
        assert short_attempt()
        elapsed = time.monotonic() - started
    assert elapsed < 2.5, elapsed
    (row,) = attribute_job(in_process.events(JOB)).attempts
    assert row.status == "success"


def test_an_emitter_without_a_context_never_loads_tracing(tmp_path: Path) -> None:
    """What every emitter outside a traced train task pays: nothing loaded."""
    code = (
        "import sys\n"
        "from airflow_ett.emit import Emitter, JsonlSink\n"
        "emitter = Emitter('j', '1', sink=JsonlSink(sys.argv[1]), spool_dir=sys.argv[2])\n"
        "emitter.attempt_started()\n"
        "emitter.phase_start('model_creation')\n"
        "emitter.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith(\n"
        "    ('opentelemetry', 'airflow_ett.emit.tracing', 'airflow_ett.ett.trace_spans'))))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRACEPARENT"}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "events.jsonl"),
                           str(tmp_path / "spool")], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
    assert len(JsonlSink(tmp_path / "events.jsonl").read()) == 2


def test_a_killed_attempt_s_span_is_ended_by_the_task_and_its_children_find_it(
        job_env: dict[str, str], tmp_path: Path) -> None:
    """A trainer SIGKILLed after step 7 never ends (so never exports) its attempt span;
    the phases it had ended are exported under that span's id. The task ends the span
    itself, under the same id (`attempt_span_id`), from the attempt's start to the end it
    recorded: the children find their parent, the trace shows the failure."""
    from airflow_ett.emit.tracing import attempt_span_id, end_unreported_attempt
    from airflow_ett.ett.events import AttemptEnded

    with OtlpReceiver() as receiver:
        env = {**os.environ, **job_env, **traced(receiver.endpoint),
               "ETT_EVENTS_FILE": str(tmp_path / "events.jsonl"), "ETT_ATTEMPT_ID": "1",
               "ETT_ATTEMPT_NUMBER": "1"}
        started = time.time()
        proc = subprocess.run([sys.executable, LOOP, "0", "0", "20", "7"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == -9, proc.stderr[-3000:]
        receiver.wait_for("the killed attempt's phases", lambda found: any(
            s.name == "ett.phase.model_creation" for s in found), timeout=30.0)
        ended = AttemptEnded(id="task.end", job=JOB, ts=time.time(), attempt="1",
                             status="failed", cause="infra", exit_code=-9,
                             message="killed by signal 9")
        assert end_unreported_attempt(env, JOB, "1", started=started, ended=ended)
        spans = receiver.wait_for("the attempt's span", lambda found: any(
            s.name == "ett.attempt" for s in found), timeout=30.0)
    (attempt,) = [s for s in spans if s.name == "ett.attempt"]
    assert attempt.span_id == f"{attempt_span_id(TRACEPARENT, JOB, '1'):016x}"
    assert (attempt.trace_id, attempt.parent) == (TRACE, PARENT)
    assert attempt.start_ns == to_us(started) * 1000 and attempt.end_ns == to_us(ended.ts) * 1000
    assert attempt.status_code == 2 and "killed by signal 9" in attempt.status_message
    children = [s for s in spans if s.name != "ett.attempt"]
    assert {s.name for s in children} >= {"ett.phase.model_creation",
                                          "ett.phase.checkpoint_restore"}
    assert {s.parent for s in children} == {attempt.span_id}
    # without a trace context the task exports nothing and says so by returning at once
    assert end_unreported_attempt({}, JOB, "1", started=started, ended=ended)
