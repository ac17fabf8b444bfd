"""The train task's trace context for its trainer (operators/tracing.py): inside the
task's span, with Airflow's `[traces] otel_on`, the trainer's environment carries that
span as `TRACEPARENT` (and where to export, from `[traces]`, when the task's environment
does not say it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span

from airflow_ett.operators import TorchRecTrainOperator, training_job
from airflow_ett.operators.tracing import trainer_trace_env


@pytest.fixture
def traces_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "True")
    for name in ("OTEL_HOST", "OTEL_PORT", "OTEL_SSL_ACTIVE"):
        monkeypatch.delenv(f"AIRFLOW__TRACES__{name}", raising=False)


@pytest.fixture
def task_span() -> Iterator[Span]:
    """What Airflow's task runner opens around the task: `worker.<task_id>`."""
    tracer = TracerProvider().get_tracer("airflow.sdk.execution_time.task_runner")
    with tracer.start_as_current_span("worker.train") as span:
        yield span


def _traceparent(span: Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


@pytest.mark.usefixtures("traces_on")
def test_inside_the_task_s_span_the_trainer_gets_it(task_span: Span) -> None:
    env = trainer_trace_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert env == {"TRACEPARENT": _traceparent(task_span)}


@pytest.mark.usefixtures("traces_on", "task_span")
@pytest.mark.parametrize(("ssl", "host", "url"), [
    ("False", "collector", "http://collector:4317/v1/traces"),
    ("True", "collector", "https://collector:4317/v1/traces"),
    ("False", "::1", "http://[::1]:4317/v1/traces"),
])
def test_airflow_s_host_and_port_name_the_endpoint_when_the_environment_does_not(
        monkeypatch: pytest.MonkeyPatch, ssl: str, host: str, url: str) -> None:
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_HOST", host)
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_PORT", "4317")
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_SSL_ACTIVE", ssl)
    assert trainer_trace_env({})["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == url
    given = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://mine:4318"}
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in trainer_trace_env(given)


def test_nothing_without_airflow_s_tracing_or_outside_a_span(
        monkeypatch: pytest.MonkeyPatch, traces_on: None) -> None:
    assert trainer_trace_env({}) == {}  # no span is current
    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "False")
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("worker.train"):
        assert trainer_trace_env({}) == {}


@pytest.mark.usefixtures("traces_on")
def test_the_train_task_passes_it_to_its_trainer_unless_it_records_nothing(
        task_span: Span) -> None:
    def train(record: bool) -> dict[str, str]:
        dag = training_job(f"traced_{record}", model="dlrm_tiny", steps=5, record=record,
                           optimizations={"compile_cache": False})
        task = dag.get_task("train")
        assert isinstance(task, TorchRecTrainOperator)
        return task.child_env()

    assert train(True)["TRACEPARENT"] == _traceparent(task_span)
    assert "TRACEPARENT" not in train(False)


@pytest.mark.usefixtures("traces_on", "ett_home")
def test_a_trainer_killed_without_a_word_still_has_its_attempt_span(
        task_span: Span, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command SIGKILLs itself: it never ends its attempt span. The task ends it,
    under the id the trainer would have given it, exported where Airflow's `[traces]`
    says (the endpoint the task derived for its trainer, not in the task's own
    environment)."""
    import sys

    from airflow_ett.emit.tracing import attempt_span_id
    from airflow_ett.jobs import job_id_for
    from airflow_ett.operators import CommandTrainOperator
    from airflow_ett.operators.errors import TrainerInfraFailure
    from tests.operators.conftest import context
    from tests.otlp_receiver import OtlpReceiver

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("AIRFLOW__TRACES__OTEL_HOST", "127.0.0.1")
        monkeypatch.setenv("AIRFLOW__TRACES__OTEL_PORT", str(receiver.port))
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp_proto_http")
        op = CommandTrainOperator(task_id="train", restarts=0, command=[
            sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
        with pytest.raises(TrainerInfraFailure):
            op.execute(context("killed"))  # type: ignore[arg-type]
        (span,) = receiver.wait_for("the attempt's span", lambda found: any(
            s.name == "ett.attempt" for s in found), timeout=30.0)
    ctx = task_span.get_span_context()
    job = job_id_for("ett_test", "killed")
    assert span.span_id == f"{attempt_span_id(_traceparent(task_span), job, '1.1'):016x}"
    assert (span.trace_id, span.parent) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert span.status_code == 2 and span.attributes["ett.attempt"] == "1.1"
