"""One trace from queue to first step, on a real Airflow (dag-processor, scheduler, API
server; SQLite, LocalExecutor) with `[traces] otel_on` pointed at an OTLP/HTTP receiver
this test runs (tests/otlp_receiver.py; OTLP/HTTP on both sides: `OTEL_TRACES_EXPORTER=
otlp_proto_http`, since Python's `otlp` is gRPC).

A small lifecycle job (`dlrm_tiny`, 40 steps, one process, one injected failure and its
in-place restart) runs once. Airflow's own spans (`dag_run.<dag>` from the scheduler,
`task_run.train` from the API server, `worker.train` from the task process) and the
trainer's (`ett.attempt` and its children, from each trainer process) arrive in one
trace: each attempt's parent chain reaches the train task's `task_run` span and the DAG
run's; the first attempt's first effective step starts where the run's TTS (from the ETT
store) ends, the second's where its recovery's TTR ends, and each phase's spans last what
the breakdown's raw phase durations say.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from dataclasses import dataclass

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.summary import JobSummary
from airflow_ett.ett.timeline import to_us
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

DAG = '''
from airflow_ett.operators import training_job

dag = training_job(
    "ett_traced", model="dlrm_tiny", steps=40, checkpoint_interval=10, tenant="t",
    faults=[{"kind": "raise", "at_step": 25, "attempt": 1}], restarts=1, retries=0,
    optimizations={"compile_cache": False, "warm_standby": False,
                   "standalone_publish": False},
    trainer_options={"batch_size": 64, "num_workers": 0, "compile": False,
                     "step_sleep_s": 0.01},
    is_paused_upon_creation=False)
'''


def _expected(spans: list[ReceivedSpan]) -> bool:
    names = [s.name for s in spans]
    return (names.count("ett.attempt") == 2
            and {"dag_run.ett_traced", "task_run.train", "worker.train"} <= set(names))


@dataclass(frozen=True)
class TracedRun:
    job: str
    spans: list[ReceivedSpan]
    summary: JobSummary
    result: JobAttribution

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    @property
    def ours(self) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name.startswith("ett.")]

    def of_attempt(self, name: str) -> dict[str, ReceivedSpan]:
        return {s.attributes["ett.attempt"]: s for s in self.named(name)}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """The job, run once on an Airflow whose every process exports to the receiver."""
    root = tmp_path_factory.mktemp("traced")
    dags = root / "dags"
    dags.mkdir()
    (dags / "traced.py").write_text(textwrap.dedent(DAG), encoding="utf-8")
    url = f"sqlite:///{root / 'ett.db'}"
    with OtlpReceiver() as receiver:
        env = {"AIRFLOW__TRACES__OTEL_ON": "True",
               "AIRFLOW__TRACES__OTEL_HOST": "127.0.0.1",
               "AIRFLOW__TRACES__OTEL_PORT": str(receiver.port),
               "OTEL_TRACES_EXPORTER": "otlp_proto_http",
               "OTEL_BSP_SCHEDULE_DELAY": "500",
               "AIRFLOW__ETT__STORE_URL": url,
               "AIRFLOW__ETT__WORK_DIR": str(root / "work")}
        with EmbeddedAirflow(root / "home", dags, extra_env=env) as af:
            migrate(af)
            af.start(WITHOUT_TRIGGERER)
            af.wait_until_ready(180.0)
            af.wait_for_dag("ett_traced", timeout=120.0)
            run_id = af.trigger("ett_traced")
            state = af.wait_for_run("ett_traced", run_id, timeout=600.0)
            assert state == "success", (af.task_instances("ett_traced", run_id),
                                        af.log_tail("scheduler"))
            spans = receiver.wait_for("Airflow's and the trainer's spans", _expected,
                                      timeout=120.0)
    job = job_id_for("ett_traced", run_id)
    with EttStore(url) as store:
        summary = store.job_summary(job)
        events = store.job_events(job)
    return TracedRun(job, spans, summary, attribute_job(events))


def test_each_attempt_nests_under_the_train_task_and_the_dag_run(traced: TracedRun) -> None:
    by_id = {s.span_id: s for s in traced.spans}
    (dag_run,) = traced.named("dag_run.ett_traced")
    (task_run,) = traced.named("task_run.train")
    (worker,) = traced.named("worker.train")
    attempts = traced.of_attempt("ett.attempt")
    assert sorted(attempts) == ["1.1", "1.2"]
    assert {s.trace_id for s in [dag_run, task_run, worker, *traced.ours]} == {
        dag_run.trace_id}
    # each attempt -> worker.train -> task_run.train -> dag_run.ett_traced (the root)
    for attempt in attempts.values():
        chain, span = [], attempt
        while span.parent:
            span = by_id[span.parent]
            chain.append(span.name)
        assert chain == ["worker.train", "task_run.train", "dag_run.ett_traced"]
        assert attempt.service == "airflow-ett-trainer"
        assert attempt.attributes["ett.job"] == traced.job
    for span in traced.ours:  # the rest are their attempt's children
        if span.name != "ett.attempt":
            assert by_id[span.parent] is attempts[span.attributes["ett.attempt"]], span
    assert attempts["1.1"].status_code == 2  # the injected failure
    assert [name for name, _, _ in attempts["1.1"].events] == ["ett.failure"]
    # the run's span starts at its queueing, which is where E2E starts
    assert dag_run.start_ns / 1e9 == pytest.approx(traced.summary.submitted_at, abs=1.0)


def test_the_first_effective_steps_are_where_tts_and_the_ttr_end(traced: TracedRun) -> None:
    result, summary = traced.result, traced.summary
    firsts = traced.of_attempt("ett.first_effective_step")
    assert firsts["1.1"].start_ns == (to_us(result.submitted_at) + result.tts_us) * 1000
    assert firsts["1.1"].start_ns / 1e9 == pytest.approx(
        summary.submitted_at + summary.tts_s, abs=1e-3)
    (failure,) = result.failures
    assert failure.ttr_us is not None and failure.cause == "application"
    assert firsts["1.2"].start_ns == (to_us(failure.at) + failure.ttr_us) * 1000
    (replay,) = traced.named("ett.replay")  # steps 21-25 again, from the step-20 save
    assert replay.end_ns == firsts["1.2"].start_ns > replay.start_ns


def test_each_phase_s_spans_last_its_raw_duration(traced: TracedRun) -> None:
    totals: dict[str, int] = defaultdict(int)
    for span in traced.ours:
        if "ett.phase" in span.attributes:
            totals[span.attributes["ett.phase"]] += (span.end_ns - span.start_ns) // 1000
    assert {"trainer_init", "data_pipeline_init", "model_creation", "checkpoint_restore",
            "checkpoint_save_blocking", "final_checkpoint", "teardown"} <= set(totals)
    assert totals == {label: traced.result.phases_raw_us[label] for label in totals}
