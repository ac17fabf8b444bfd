"""Any trainer under the lifecycle, on a real Airflow (SQLite, LocalExecutor, scheduler,
dag-processor and API server as processes): `training_job(command=[...])` around each
adapter's example trainer (a bare loop, a TorchRec pipeline loop, a Lightning fit, a
Hugging Face `Trainer`), each failing once by an exception and once by a SIGKILL, then
asked to leave at its next checkpoint (the request the preemption controller leaves):
the train task restarts it in place, reschedules it without spending a retry, and the
job's ETT breakdown has TTS, a TTR per failure, NoF by cause and Level-2 components
summing to E2E. A trainer that knows nothing of ETT gets Level 1 from its log lines."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.ett.events import AttemptStarted, CheckpointSaved, Progress
from airflow_ett.jobs import job_id_for
from airflow_ett.operators.job import job_paths
from airflow_ett.protocol.request import PreemptRequest, write_request
from airflow_ett.store import EttStore
from tests.e2e.lifecycle.shared import dag_folder

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

ADAPTERS = {
    "loop_job": "airflow_ett.examples.loop_train",
    "torchrec_job": "airflow_ett.examples.torchrec_pipeline_train",
    "lightning_job": "airflow_ett.examples.lightning_train",
    "hf_job": "airflow_ett.examples.hf_train",
}

DAGS = '''
import sys
from airflow_ett.operators import training_job

for dag_id, module in {adapters!r}.items():
    globals()[dag_id] = training_job(
        dag_id,
        command=[{python!r}, "-m", module, "--steps", "40", "--every", "5",
                 "--step-sleep", "0.05", "--fail", "raise@8@1", "--fail", "kill@14@2"],
        tenant="research", restarts=3, retries=1, is_paused_upon_creation=False)

plain_job = training_job(
    "plain_job", command=[{python!r}, "plain_trainer.py"], model="plain",
    progress_pattern=r"^step (?P<step>\\d+) loss (?P<loss>[0-9.]+)$", restarts=1,
    is_paused_upon_creation=False)
'''

#: A trainer that knows nothing of ETT: prints its steps, fails once on its first attempt.
PLAIN_TRAINER = '''
import os, sys, time
first = os.environ.get("ETT_ATTEMPT_NUMBER") == "1"
for step in range(1, 31):
    time.sleep(0.05)
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if first and step == 12:
        sys.exit(3)
'''


@pytest.fixture(scope="module")
def airflow(shared_airflow: EmbeddedAirflow) -> EmbeddedAirflow:
    dags = dag_folder(shared_airflow, "commands")
    (dags / "command_dags.py").write_text(textwrap.dedent(DAGS.format(
        adapters=ADAPTERS, python=sys.executable)))
    (dags / "plain_trainer.py").write_text(textwrap.dedent(PLAIN_TRAINER))
    (dags / ".airflowignore").write_text("plain_trainer.py\n")
    return shared_airflow


def _events(af: EmbeddedAirflow, job: str) -> list[Any]:
    with EttStore(f"sqlite:///{af.home}/ett.db") as store:
        return store.job_events(job)


def _ask_at_checkpoint(af: EmbeddedAirflow, runs: dict[str, str], stop: threading.Event
                       ) -> None:
    """The controller's part: once a job's third attempt has started, leave an
    `at_checkpoint` request in its job directory (the task watches it; the trainer claims
    it at its next periodic save). Asked at the attempt's start, not at its first
    progress: under load a short attempt could finish between one look at its progress
    and the request, and then never yield (seen in CI); from its start, every save of the
    attempt comes after the request."""
    waiting = dict(runs)
    while waiting and not stop.wait(0.2):
        for dag_id, run_id in list(waiting.items()):
            job = job_id_for(dag_id, run_id)
            if any(isinstance(e, AttemptStarted) and e.attempt == "1.3"
                   for e in _events(af, job)):
                now = time.time()
                write_request(job_paths(af.home / "ett_work", dag_id, run_id).job_dir,
                              PreemptRequest(victim=job, for_job="urgent/run",
                                             reason="urgent needs the GPUs",
                                             requested_at=now, grace_s=30.0,
                                             # the product's default: a shorter one can
                                             # race Airflow's executor events (#10790)
                                             resume_after_s=10.0, mode="at_checkpoint",
                                             leave_by=now + 120.0))
                del waiting[dag_id]


def test_every_adapter_recovers_and_yields_at_its_checkpoint(airflow: EmbeddedAirflow
                                                              ) -> None:
    for dag_id in (*ADAPTERS, "plain_job"):
        airflow.wait_for_dag(dag_id, timeout=120.0)
    runs = {dag_id: airflow.trigger(dag_id) for dag_id in ADAPTERS}
    plain_run = airflow.trigger("plain_job")
    stop = threading.Event()
    asker = threading.Thread(target=_ask_at_checkpoint, args=(airflow, runs, stop),
                             daemon=True)
    asker.start()
    try:
        for dag_id, run_id in runs.items():
            state = airflow.wait_for_run(dag_id, run_id, timeout=600.0)
            assert state == "success", (dag_id, airflow.task_instances(dag_id, run_id))
    finally:
        stop.set()
        asker.join()
    for dag_id, run_id in runs.items():
        (train,) = airflow.task_instances(dag_id, run_id)
        with EttStore(f"sqlite:///{airflow.home}/ett.db") as store:
            summary = store.summary(job_id_for(dag_id, run_id))
        log = airflow.task_log_path(dag_id, run_id, "train", train["try_number"])
        assert train["try_number"] == 1, (dag_id, summary["attempts"],  # no retry spent
                                          log.read_text()[-6000:] if log.exists() else "")
        assert summary["nof"] == {"preemption": 1, "infra": 1, "application": 1,
                                  "unknown": 0, "total": 3}, dag_id
        assert summary["tts_s"] > 0 and len(summary["ttr_s"]) == 3, dag_id
        assert sum(summary["components"].values()) == pytest.approx(summary["e2e_s"],
                                                                   abs=1e-3), dag_id
        assert summary["components"]["effective_training"] > 0.5, dag_id
        assert summary["components"]["scheduling"] > 0, dag_id  # queued, rescheduled
        assert summary["phases"].get("replay", 0) > 0, (dag_id, summary["phases"],
                                                        summary["failures"])
        # the rescheduled attempt resumed at the save the third one left on
        events = _events(airflow, job_id_for(dag_id, run_id))
        left_at = max(e.step for e in events if isinstance(e, CheckpointSaved)
                      and e.attempt == "1.3")
        after = [e for e in events if isinstance(e, Progress)
                 and e.attempt not in ("1.1", "1.2", "1.3")]
        if not after:
            # the request was seen late (the asker polls) and the third attempt left on
            # its final save: the rescheduled attempt restored step 40 and had nothing to
            # train. Had it restored an earlier save, it would have reported steps.
            assert left_at == 40, (dag_id, left_at)
            continue
        assert min(e.step_start for e in after) in (left_at, left_at + 1), dag_id
        assert max(e.step_end for e in after) == 40, dag_id
    # the trainer that reports nothing: Level 1 from its attempts and its log lines
    assert airflow.wait_for_run("plain_job", plain_run, timeout=300.0) == "success"
    with EttStore(f"sqlite:///{airflow.home}/ett.db") as store:
        plain = store.summary(job_id_for("plain_job", plain_run))
    assert plain["nof"]["unknown"] == 1 and plain["nof"]["total"] == 1  # exit 3
    assert plain["tts_s"] > 0 and len(plain["ttr_s"]) == 1
    assert plain["components"]["effective_training"] > 0.5  # 30 steps of 50 ms, as logged
    assert plain["phases"]["replay"] > 0  # it starts over: steps 1-12 again
