"""The train task's recovery paths on a real Airflow, with the tiny model (compile off):

- a failure with no in-place restart left goes to Airflow's retry, whose try restores
  the newest checkpoint and continues the job's attempt numbering (the task state store);
- a person marking the running train task failed in the API: Airflow stops the task, its
  `on_kill` has the trainer checkpoint and leave, and the API server's listener records
  the state change.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    JobEnded,
    PhaseEnded,
    PhaseStarted,
    Progress,
    TaskStateChanged,
)
from airflow_ett.jobs import job_id_for
from airflow_ett.operators.job import job_paths
from airflow_ett.store import EttStore, JobNotFound
from tests.e2e.lifecycle.shared import dag_folder

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

DAGS = '''
from datetime import timedelta

from airflow_ett.operators import training_job

TINY = {"compile": False, "num_workers": 0, "batch_size": 64, "log_every_s": 1.0}

retry_dag = training_job(
    dag_id="ett_retry", tenant="t", model="dlrm_tiny", steps=60, checkpoint_interval=10,
    restarts=0, retries=1, retry_delay=timedelta(seconds=1),
    faults=[{"kind": "raise", "at_step": 35, "attempt": 1}],
    optimizations={"compile_cache": False}, trainer_options=TINY,
)
long_dag = training_job(
    dag_id="ett_long", tenant="t", model="dlrm_tiny", steps=100_000,
    checkpoint_interval=100_000, restarts=2, retries=0,
    optimizations={"compile_cache": False, "standalone_publish": False},
    trainer_options={**TINY, "step_sleep_s": 0.01, "grace_s": 20.0},
)
'''


@pytest.fixture(scope="module")
def airflow(shared_airflow: EmbeddedAirflow) -> EmbeddedAirflow:
    dags = dag_folder(shared_airflow, "recovery")
    (dags / "ett_recovery_dags.py").write_text(textwrap.dedent(DAGS))
    return shared_airflow


def events(af: EmbeddedAirflow, dag_id: str, run_id: str) -> list[Any]:
    with EttStore(f"sqlite:///{af.home}/ett.db") as store:
        try:
            return store.job_events(job_id_for(dag_id, run_id))
        except JobNotFound:
            return []


def test_an_airflow_retry_restores_and_continues_the_attempt_numbers(
        airflow: EmbeddedAirflow) -> None:
    airflow.wait_for_dag("ett_retry", timeout=120.0)
    airflow.unpause("ett_retry")
    run_id = airflow.trigger("ett_retry")
    assert airflow.wait_for_run("ett_retry", run_id, timeout=300.0) == "success"
    train = next(t for t in airflow.task_instances("ett_retry", run_id)
                 if t["task_id"] == "train")
    assert train["try_number"] == 2

    got = events(airflow, "ett_retry", run_id)
    assert sorted({e.attempt for e in got if isinstance(e, AttemptStarted)}) == ["1.1", "2.1"]
    failed = [e for e in got if isinstance(e, AttemptEnded) and e.status == "failed"]
    assert [(e.attempt, e.cause) for e in failed] == [("1.1", "application")]
    assert any(isinstance(e, PhaseStarted) and e.phase == "checkpoint_restore"
               and e.attempt == "2.1" for e in got)
    resumed = min(e.step_start for e in got if isinstance(e, Progress) and e.attempt == "2.1")
    assert resumed == 30  # the newest checkpoint before the failure after step 35
    states = [(e.try_number, e.state) for e in got
              if isinstance(e, TaskStateChanged) and e.task_id == "train"]
    assert (1, "up_for_retry") in states and (2, "success") in states
    assert any(isinstance(e, PhaseEnded) and e.phase == "retry_delay" for e in got)
    log = airflow.task_log_path("ett_retry", run_id, "train", 2).read_text()
    assert "job attempt #2" in log  # numbering continued through the task state store
    with EttStore(f"sqlite:///{airflow.home}/ett.db") as store:
        summary = store.summary(job_id_for("ett_retry", run_id))
    assert summary["nof"]["application"] == 1 and summary["phases"]["replay"] > 0


def test_marking_the_running_train_task_failed_checkpoints_and_is_recorded(
        airflow: EmbeddedAirflow) -> None:
    airflow.wait_for_dag("ett_long", timeout=120.0)
    airflow.unpause("ett_long")
    run_id = airflow.trigger("ett_long")
    airflow.wait_until("the long job's first steps", lambda: [
        e for e in events(airflow, "ett_long", run_id) if isinstance(e, Progress)],
        timeout=180.0)
    airflow.api("PATCH", f"/api/v2/dags/ett_long/dagRuns/{run_id}/taskInstances/train",
                {"new_state": "failed"})
    assert airflow.wait_for_run("ett_long", run_id, timeout=120.0) == "failed"

    def ended_job() -> list[Any]:  # the killed task's last events may still be on their way
        got = events(airflow, "ett_long", run_id)
        ends = {type(e) for e in got} >= {AttemptEnded, JobEnded}
        return got if ends else []

    got = airflow.wait_until("the stopped job's attempt and job ends", ended_job, timeout=60.0)
    ended = [e for e in got if isinstance(e, AttemptEnded)]
    manual = [e for e in got if isinstance(e, TaskStateChanged) and e.source == "api"]
    assert [(e.task_id, e.state) for e in manual] == [("train", "failed")]
    # on_kill: SIGTERM to the trainer, which saved a checkpoint and left as preempted
    assert [(e.attempt, e.cause, e.exit_code) for e in ended] == [("1.1", "preemption", 75)]
    assert {e.attempt for e in got if isinstance(e, AttemptStarted)} == {"1.1"}  # no restart
    assert [e.status for e in got if isinstance(e, JobEnded)][-1] == "failed"
    job_dir = job_paths(airflow.home / "ett_work", "ett_long", run_id).job_dir
    checkpoints = list(job_dir.rglob("step-*"))
    assert checkpoints, "on_kill did not make the trainer checkpoint"
