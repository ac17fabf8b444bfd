"""An adapter's example trainer, as the train task runs it: real processes under the
launcher (`run_attempts`, what `CommandTrainOperator` calls), an exception on attempt
1, a SIGKILL on attempt 2, an `at_checkpoint` preemption request claimed on attempt 3,
and attempt 4 finishing (any example of `EXAMPLES` runs here; the suite runs the bare
loop, and all four through Airflow). The ETT breakdown of the events they wrote has TTS, a TTR per
failure, NoF by cause and Level-2 components summing to E2E. The lifecycle DAG around
them (the operator, Airflow's reschedule) is tests/e2e/lifecycle/test_command_dag.py."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import CheckpointSaved, Progress, read_events
from airflow_ett.protocol.request import CLAIMED_FILE, PreemptRequest, write_request
from airflow_ett.trainer.launcher import AttemptOutcome, Command, run_attempts

pytestmark = pytest.mark.integration

JOB = "adapters/run1"
STEPS, EVERY = 40, 5

EXAMPLES = {
    "loop": "airflow_ett.examples.loop_train",
    "torchrec": "airflow_ett.examples.torchrec_pipeline_train",
    "lightning": "airflow_ett.examples.lightning_train",
    "hf": "airflow_ett.examples.hf_train",
}


def _ask_at_checkpoint_once_attempt_3_steps(events: Path, job_dir: Path,
                                            done: threading.Event) -> None:
    """The controller's part: once attempt 3 has reported progress, leave an
    `at_checkpoint` request in its job directory."""
    while not done.wait(0.1):
        try:
            found = [e for e in read_events(str(events)).events
                     if isinstance(e, Progress) and e.attempt == "3"]
        except (OSError, ValueError):
            continue
        if found:
            now = time.time()
            write_request(job_dir, PreemptRequest(
                victim=JOB, for_job="urgent/run", reason="urgent needs the GPUs",
                requested_at=now, grace_s=30.0, mode="at_checkpoint", leave_by=now + 120))
            return


def run_job(module: str, root: Path) -> tuple[list[AttemptOutcome], Any, list[Any]]:
    events, job_dir = root / "events.jsonl", root / "job"
    job_dir.mkdir(parents=True)
    env = {"ETT_EVENTS_FILE": str(events), "ETT_JOB_DIR": str(job_dir),
           "ETT_CHECKPOINT_DIR": str(job_dir / "checkpoints"), "ETT_GRACE_S": "30"}
    task = Emitter(JOB, sink=JsonlSink(str(events)), replay_on_start=False)
    task.job_submitted(ts=time.time())

    def ended(outcome: AttemptOutcome) -> None:  # as the operator reports a silent end
        cls = outcome.exit_class
        task.bind(JOB, outcome.attempt_id).attempt_ended(
            cls.status, cls.cause, exit_code=outcome.exit_code, message=cls.description,
            detected_ts=outcome.ended, ts=outcome.ended)

    done = threading.Event()
    asker = threading.Thread(target=_ask_at_checkpoint_once_attempt_3_steps,
                             args=(events, job_dir, done), daemon=True)
    asker.start()
    command = Command.of([sys.executable, "-m", module, "--steps", str(STEPS), "--every",
                          str(EVERY), "--step-sleep", "0.05", "--fail", "raise@8@1",
                          "--fail", "kill@14@2"])
    try:
        result = run_attempts(
            command, JOB, max_attempts=5, env=env, cwd=job_dir, report_unreported=ended,
            on_start=lambda proc, n, aid: task.bind(JOB, aid).attempt_started(
                ts=time.time()))
    finally:
        done.set()
        asker.join()
    task.job_ended("success" if result.succeeded else "failed")
    task.close()
    evs = read_events(str(events)).events
    return result.attempts, attribute_job(evs).summary(), evs


# The bare loop here, every adapter through Airflow (tests/e2e/lifecycle/test_command_dag.py): the
# same faults and request, the suite's time spent once per adapter.
@pytest.mark.parametrize("name", ["loop"])
def test_an_adapter_job_recovers_and_leaves_at_its_checkpoint(tmp_path: Path,
                                                              name: str) -> None:
    attempts, summary, events = run_job(EXAMPLES[name], tmp_path)
    codes = [a.exit_code for a in attempts]
    assert codes == [1, -9, 75, 0], [a.exit_class.description for a in attempts]
    # the trainer reported its own ends (exit records), except the SIGKILLed one
    assert [a.exit_class.reported_by_child for a in attempts] == [True, False, True, True]
    assert (tmp_path / "job" / CLAIMED_FILE).exists()  # claimed by rename, left on it
    assert summary.nof == {"preemption": 1, "infra": 1, "application": 1, "unknown": 0,
                           "total": 3}
    assert summary.tts_s > 0 and len(summary.ttr_s) == 3 and all(t > 0 for t in summary.ttr_s)
    assert sum(summary.components.values()) == pytest.approx(summary.e2e_s, abs=1e-3)
    assert summary.components["effective_training"] > 0.5  # 40 steps of >= 50 ms
    assert summary.components["initialization"] > 0
    assert summary.phases.get("replay", 0) > 0  # attempt 2 re-read steps 6-8
    saves = [e for e in events if isinstance(e, CheckpointSaved)]
    # every attempt saved (the SIGKILLed one's report may die with it, undelivered)
    assert {"1", "3", "4"} <= {e.attempt for e in saves}
    assert all(e.step % EVERY == 0 and e.blocking_s > 0 for e in saves)
    messages = {a.attempt: a.message for a in summary.attempts}
    assert (messages["3"] or "").startswith("left at its checkpoint on request: urgent")
    # the last attempt resumed where the third left (its claimed save) and finished
    last = [e for e in events if isinstance(e, Progress) and e.attempt == "4"]
    assert max(e.step_end for e in last) == STEPS
    left_at = max(e.step for e in events if isinstance(e, CheckpointSaved)
                  and e.attempt == "3")
    # resumed at the claimed save (a pipeline's first step is start-up: one later)
    assert min(e.step_start for e in last) in (left_at, left_at + 1)


RANKED = '''
import os, sys, time
from airflow_ett.adapters import job

with job() as ett:
    for step in range(1, 7):
        time.sleep(0.02)
        ett.step(step)
        if step == 3 and os.environ["RANK"] == "1" and os.environ["ETT_ATTEMPT_NUMBER"] == "1":
            raise RuntimeError("rank 1 lost its data shard")
'''


def test_under_torchrun_the_failed_rank_names_the_cause(tmp_path: Path) -> None:
    """A command of two ranks (`torchrun --no-python`): rank 1 raises; torchrun's exit 1
    says nothing, the ranks' exit records say it was rank 1's application error, which
    rank 0 (done, or SIGTERMed by torchrun) did not report: the task reports it."""
    script = tmp_path / "ranked.py"
    script.write_text(RANKED)
    seen: list[AttemptOutcome] = []
    result = run_attempts(Command.of([sys.executable, str(script)], nproc=2), JOB,
                          max_attempts=2, report_unreported=seen.append,
                          env={"ETT_EVENTS_FILE": str(tmp_path / "events.jsonl")})
    first, second = result.attempts
    assert first.exit_code == 1 and first.exit_class.cause == "application"
    assert first.exit_class.description.startswith("rank 1: the training code raised "
                                                   "(RuntimeError: rank 1 lost its data")
    assert not first.exit_class.reported_by_child and seen == [first]
    assert second.exit_code == 0 and second.exit_class.reported_by_child
    assert {r.rank for r in second.ranks} == {0, 1}
