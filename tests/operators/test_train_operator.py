"""`TorchRecTrainOperator.execute` with the real trainer as its child, no scheduler.

Each test trains `dlrm_tiny` (compile off) for a few seconds per attempt and reads what
the operator and the trainer recorded back from a real (SQLite) ETT store.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    JobEnded,
    PhaseStarted,
    Progress,
    RankSteps,
)
from airflow_ett.operators import TorchRecTrainOperator
from airflow_ett.operators.errors import (
    TrainerApplicationError,
    TrainerConfigError,
    TrainerInfraFailure,
    TrainerPreempted,
)
from airflow_ett.operators.train import ATTEMPTS_KEY, first_attempt_number
from airflow_ett.trainer.checkpoint import read_marker
from tests.operators.conftest import (
    TINY,
    DictStateStore,
    context,
    execute_in_thread,
    started_trainer,
    store_events,
    store_summary,
)
from tests.proc_tree import TreeRecorder, still_running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TORCHRUN = Path(sys.executable).with_name("torchrun")


def operator(**changes: Any) -> TorchRecTrainOperator:
    config = {**TINY, **changes.pop("config", {})}
    return TorchRecTrainOperator(task_id="train", trainer_config=config, **changes)


def test_first_attempt_number_continues_over_tries() -> None:
    assert first_attempt_number(None, 1, 2) == 1
    assert first_attempt_number(3, 2, 2) == 4  # the store knows 3 ran before
    assert first_attempt_number(None, 3, 1) == 5  # without it: 2 launches per earlier try


@pytest.mark.parametrize("warm_standby", [False, True])
def test_a_killed_trainer_is_restarted_in_place_and_the_kill_is_recorded(
        ett_home: Path, warm_standby: bool, caplog: pytest.LogCaptureFixture) -> None:
    """With `warm_standby` the restart is the spare the launcher started once attempt 1
    had stepped (trainer/standby.py); the record is the same either way."""
    op = operator(restarts=1, config={
        # the kill comes seconds after the first step: the launcher looks for that step
        # once a second before it starts the spare
        "faults": [{"kind": "kill", "at_step": 15, "attempt": 1}], "step_sleep_s": 0.2,
        "optimizations": {"warm_standby": warm_standby}})
    store = DictStateStore()
    with caplog.at_level(logging.INFO, logger="airflow_ett.trainer"):
        result = op.execute(context("kill", store=store))
    took_over = [r for r in caplog.records if "taken over by its warm standby" in r.message]
    assert len(took_over) == (1 if warm_standby else 0), caplog.text[-3000:]
    assert result["attempts"] == ["1.1", "1.2"]
    assert result["exit_codes"] == [-9, 0]
    assert store[ATTEMPTS_KEY] == 2

    events = store_events("ett_test__kill")
    ended = {e.attempt: e for e in events if isinstance(e, AttemptEnded)}
    assert (ended["1.1"].cause, ended["1.1"].exit_code) == ("infra", -9)
    assert ended["1.1"].message == "killed by SIGKILL"  # the operator's word: the child died
    assert ended["1.2"].status == "success"
    assert {e.attempt for e in events if isinstance(e, AttemptStarted)} == {"1.1", "1.2"}
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["success"]
    summary = store_summary("ett_test__kill")
    assert summary["nof"]["infra"] == 1 and summary["nof"]["total"] == 1
    assert summary["phases"].get("replay", 0) > 0  # steps 11-15 ran twice
    assert sum(summary["components"].values()) == pytest.approx(summary["e2e_s"], abs=1e-5)


def test_a_failure_goes_to_airflow_retry_and_the_retry_restores(ett_home: Path) -> None:
    op = operator(restarts=0, config={"faults": [{"kind": "raise", "at_step": 15,
                                                   "attempt": 1}]})
    store = DictStateStore()
    with pytest.raises(TrainerApplicationError) as err:
        op.execute(context("retry", try_number=1, max_tries=1, store=store))
    assert err.value.exit_code == 1
    assert not [e for e in store_events("ett_test__retry") if isinstance(e, JobEnded)]

    result = op.execute(context("retry", try_number=2, max_tries=1, store=store))
    assert result["attempts"] == ["2.1"] and store[ATTEMPTS_KEY] == 2
    events = store_events("ett_test__retry")
    restores = [e for e in events if isinstance(e, PhaseStarted)
                and e.phase == "checkpoint_restore" and e.attempt == "2.1"]
    assert restores, "the retry did not restore"
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["success"]
    assert store_summary("ett_test__retry")["nof"]["application"] == 1


def test_the_last_try_failing_ends_the_job(ett_home: Path) -> None:
    op = operator(restarts=1, config={"faults": [{"kind": "raise", "at_step": 5}]})
    with pytest.raises(TrainerApplicationError, match="after 2 launch"):
        op.execute(context("last", try_number=1, max_tries=0))
    assert [e.status for e in store_events("ett_test__last")
            if isinstance(e, JobEnded)] == ["failed"]


def test_bad_trigger_params_fail_fast_without_starting_the_trainer(ett_home: Path) -> None:
    op = operator()
    with pytest.raises(TrainerConfigError, match="'inject_fault' = 'explode'"):
        op.execute(context("params", params={"inject_fault": "explode"}))
    assert not (ett_home / "ett_work" / "jobs").exists() or not list(
        (ett_home / "ett_work").rglob("checkpoints"))


def test_a_trainer_that_cannot_start_fails_without_retries(
        ett_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker where torchrec cannot be imported: the trainer exits 78 (bad setup), which
    # no retry can heal, so the task must fail at once instead of burning its retries.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "torchrec.py").write_text("raise ImportError('torchrec is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    with pytest.raises(TrainerConfigError, match="exit 78"):
        operator(restarts=2).execute(context("setup", max_tries=3))
    events = store_events("ett_test__setup")
    assert len([e for e in events if isinstance(e, AttemptStarted)]) == 1  # no restart
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["failed"]


def test_on_kill_asks_the_trainer_to_checkpoint_and_leave(ett_home: Path) -> None:
    op = operator(restarts=3, config={"steps": 5000, "step_sleep_s": 0.01,
                                      "checkpoint_interval": 1000})
    thread, outcome = execute_in_thread(op, "kill_task")
    thread.start()
    deadline = time.monotonic() + 120
    # Until the trainer trains (its SIGTERM handler is in place by then): the operator's
    # own attempt_started comes first, so waiting for that raced the trainer's startup.
    while not any(isinstance(e, Progress) for e in store_events("ett_test__kill_task")):
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.5)
    time.sleep(1.0)  # let it train some steps past the restore point
    op.on_kill()
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), TrainerPreempted), outcome
    assert outcome["error"].exit_code == 75
    events = store_events("ett_test__kill_task")
    assert {e.attempt for e in events if isinstance(e, AttemptStarted)} == {"1.1"}  # no restart
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert [(e.status, e.cause) for e in ended] == [("failed", "preemption")]
    checkpoints = list((ett_home / "ett_work" / "jobs").rglob("step-*"))
    assert checkpoints, "SIGTERM did not leave a checkpoint"
    assert max(read_marker(p).step for p in checkpoints) > 0


@pytest.mark.parametrize(("code", "raised"), [
    (75, "TrainerPreempted"), (-9, "TrainerInfraFailure"), (1, "TrainerApplicationError"),
    (-15, "TrainerPreempted"), (3, "TrainerFailed"), (78, "TrainerConfigError"),
])
def test_each_exit_code_becomes_the_failure_airflow_retries_or_not(
        code: int, raised: str, ett_home: Path) -> None:
    from airflow_ett.protocol.exits import classify_exit
    from airflow_ett.trainer.launcher import AttemptOutcome, LaunchResult

    op = operator()
    result = LaunchResult([AttemptOutcome(1, "1.1", code, classify_exit(code), 0.0, 1.0)])
    with pytest.raises(Exception) as err:
        op._failed(context("codes", max_tries=3), result, last_try=False)
    assert type(err.value).__name__ == raised
    retried_by_airflow = raised != "TrainerConfigError"
    from airflow.sdk.exceptions import AirflowFailException

    assert isinstance(err.value, AirflowFailException) is not retried_by_airflow


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")
def test_on_kill_past_its_grace_kills_every_process_of_a_torchrun_job(
        ett_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ranks hang (SIGTERM only sets a flag their loop never reads), so torchrun,
    which forwards SIGTERM and then waits 30 s for them, is still waiting when on_kill's
    grace ends. Killing torchrun alone would orphan the ranks: they run in sessions of
    their own."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    op = operator(nproc=2, restarts=2, config={
        "steps": 1000, "checkpoint_interval": 1000, "grace_s": 1.0,
        "faults": [{"kind": "hang", "at_step": 3}]})
    thread, outcome = execute_in_thread(op, "kill_tree")
    with TreeRecorder() as recorder:
        thread.start()
        try:
            deadline = time.monotonic() + 120
            recorder.watch(started_trainer(op, thread, outcome, deadline))
            while not any(isinstance(e, Progress) and e.step_end >= 3
                          for e in store_events("ett_test__kill_tree")):
                assert time.monotonic() < deadline and thread.is_alive(), outcome
                time.sleep(0.5)
            time.sleep(1.0)  # the step after: both ranks are in the hang
            op.on_kill()
            left = still_running(recorder.starts)  # on_kill returns once all are gone
        finally:
            thread.join(60)
        ranks = recorder.matching("-m airflow_ett.trainer")
    assert not thread.is_alive()
    assert len(ranks) >= 3, recorder.processes  # torchrun and its two ranks
    assert left == {}, left
    assert isinstance(outcome.get("error"), TrainerInfraFailure), outcome
    assert outcome["error"].exit_code == -9  # torchrun outlived the grace: SIGKILL
    events = store_events("ett_test__kill_tree")
    assert {e.attempt for e in events if isinstance(e, AttemptStarted)} == {"1.1"}


def test_a_preemption_request_checkpoints_yields_and_resumes_in_the_same_try(
        ett_home: Path) -> None:
    """The controller's request (a file in the job directory): the trainer checkpoints
    and leaves, the task reschedules itself (no retry spent, no failure), and the next
    execution in the same try restores the checkpoint and finishes, with attempt ids that
    stay unique and the request's reason in the preempted attempt's end."""
    from airflow.exceptions import AirflowRescheduleException

    from airflow_ett.operators.job import job_paths
    from airflow_ett.protocol.request import PreemptRequest, read_request, write_request

    op = operator(restarts=1, config={"steps": 400, "step_sleep_s": 0.02,
                                      "checkpoint_interval": 1000})
    store = DictStateStore()
    job = "ett_test__yield"
    thread, outcome = execute_in_thread(op, "yield", store=store)
    thread.start()
    deadline = time.monotonic() + 120
    while not any(isinstance(e, Progress) for e in store_events(job)):
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.5)
    time.sleep(1.0)
    job_dir = job_paths(ett_home / "ett_work", "ett_test", "yield").job_dir
    reason = "preempted ett_test__yield: tenant batch over its guarantee by 1 GPU"
    write_request(job_dir, PreemptRequest(victim=job, for_job="ads__r1", reason=reason,
                                          requested_at=time.time(), grace_s=30.0,
                                          resume_after_s=3.0))
    thread.join(90)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert isinstance(error, AirflowRescheduleException), outcome
    assert 0 < (error.reschedule_date.timestamp() - time.time()) <= 3.0
    assert read_request(job_dir) is None  # acted on once, kept aside
    assert len(list(job_dir.glob("preempt_request.*.done.json"))) == 1
    events = store_events(job)
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert [(e.attempt, e.cause) for e in ended] == [("1.1", "preemption")]
    assert ended[0].message == f"SIGTERM on request, checkpointed and left: {reason}"
    assert not [e for e in events if isinstance(e, JobEnded)]  # the job goes on
    # Rescheduled: the same try runs again, restores and finishes.
    result = op.execute(context("yield", try_number=1, store=store))
    assert result["attempts"] == ["1.3"]  # numbered past the first execution's restarts
    events = store_events(job)
    assert {e.attempt for e in events if isinstance(e, AttemptStarted)} == {"1.1", "1.3"}
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["success"]
    restores = [e for e in events if isinstance(e, PhaseStarted)
                and e.phase == "checkpoint_restore" and e.attempt == "1.3"]
    assert restores, "the resumed attempt did not restore"


def test_a_request_made_before_the_task_began_is_stale_and_ignored(ett_home: Path) -> None:
    """The controller saw an earlier execution: its request must not preempt this one."""
    from airflow_ett.operators.job import job_paths
    from airflow_ett.protocol.request import PreemptRequest, read_request, write_request

    job_dir = job_paths(ett_home / "ett_work", "ett_test", "stale").job_dir
    job_dir.mkdir(parents=True)
    write_request(job_dir, PreemptRequest(victim="ett_test__stale", for_job="other__r",
                                          reason="old", requested_at=time.time() - 60,
                                          grace_s=30.0))
    result = operator().execute(context("stale"))
    assert result["attempts"] == ["1.1"]  # trained to the end, not preempted
    assert read_request(job_dir) is None  # put aside
    events = store_events("ett_test__stale")
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["success"]


def _trains(job: str, thread: Any, outcome: dict[str, Any]) -> None:
    deadline = time.monotonic() + 120
    while not any(isinstance(e, Progress) for e in store_events(job)):
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.5)


def test_an_at_checkpoint_request_leaves_at_the_next_checkpoint_without_a_signal(
        ett_home: Path) -> None:
    """No SIGTERM: the trainer leaves right after its next periodic save committed, with
    no exit save; the task reschedules as for a `now` request, and the resumed execution
    restores that checkpoint and finishes."""
    from airflow.exceptions import AirflowRescheduleException

    from airflow_ett.ett.events import CheckpointSaved
    from airflow_ett.operators.job import job_paths
    from airflow_ett.protocol.request import PreemptRequest, read_request, write_request

    op = operator(restarts=1, config={"steps": 400, "step_sleep_s": 0.02,
                                      "checkpoint_interval": 60})
    store = DictStateStore()
    job = "ett_test__at_ckpt"
    thread, outcome = execute_in_thread(op, "at_ckpt", store=store)
    thread.start()
    _trains(job, thread, outcome)
    job_dir = job_paths(ett_home / "ett_work", "ett_test", "at_ckpt").job_dir
    reason = "preempted ett_test__at_ckpt: tenant batch over its guarantee by 1 GPU"
    asked = time.time()
    write_request(job_dir, PreemptRequest(
        victim=job, for_job="ads__r1", reason=reason, requested_at=asked, grace_s=30.0,
        resume_after_s=3.0, mode="at_checkpoint", leave_by=asked + 120.0))
    thread.join(90)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), AirflowRescheduleException), outcome
    assert read_request(job_dir) is None  # acted on once, kept aside
    assert len(list(job_dir.glob("preempt_request.*.done.json"))) == 1
    events = store_events(job)
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert [(e.attempt, e.cause) for e in ended] == [("1.1", "preemption")]
    assert ended[0].message == f"left at its checkpoint on request: {reason}"
    saved = [e for e in events if isinstance(e, CheckpointSaved) and e.attempt == "1.1"]
    assert saved and all(e.step % 60 == 0 and not e.final for e in saved)  # periodic only
    assert saved[-1].start_ts >= asked  # it left on the first save after the request
    assert not any(e.start_ts >= asked for e in saved[:-1])
    result = op.execute(context("at_ckpt", try_number=1, store=store))
    assert result["attempts"] == ["1.3"]
    events = store_events(job)
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["success"]
    restored = [e for e in events if isinstance(e, PhaseStarted)
                and e.phase == "checkpoint_restore" and e.attempt == "1.3"]
    assert restored, "the resumed attempt did not restore"


def test_a_withdrawn_request_lets_training_go_on_and_a_late_one_falls_back_to_now(
        ett_home: Path) -> None:
    """No periodic save comes (interval 1000 steps): a withdrawn `at_checkpoint` request
    changes nothing; the next one, past its `leave_by`, is acted on as `now` (SIGTERM,
    checkpoint, reschedule)."""
    from airflow.exceptions import AirflowRescheduleException

    from airflow_ett.operators.job import job_paths
    from airflow_ett.protocol.request import (
        PreemptRequest,
        withdraw_request,
        write_request,
    )

    op = operator(restarts=1, config={"steps": 100_000, "step_sleep_s": 0.02,
                                      "checkpoint_interval": 1000})
    job = "ett_test__withdraw"
    thread, outcome = execute_in_thread(op, "withdraw", store=DictStateStore())
    thread.start()
    _trains(job, thread, outcome)
    job_dir = job_paths(ett_home / "ett_work", "ett_test", "withdraw").job_dir

    def ask(leave_in: float) -> None:
        at = time.time()
        write_request(job_dir, PreemptRequest(
            victim=job, for_job="ads__r1", reason="make room", requested_at=at,
            grace_s=30.0, resume_after_s=3.0, mode="at_checkpoint", leave_by=at + leave_in))

    ask(600.0)
    time.sleep(2.5)  # the task holds it
    assert withdraw_request(job_dir) is not None
    time.sleep(2.5)  # the task sees it gone
    assert thread.is_alive() and not [e for e in store_events(job)
                                      if isinstance(e, AttemptEnded)]
    ask(3.0)  # no checkpoint will come by then
    thread.join(90)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), AirflowRescheduleException), outcome
    ended = [e for e in store_events(job) if isinstance(e, AttemptEnded)]
    assert [(e.attempt, e.cause) for e in ended] == [("1.1", "preemption")]
    assert ended[0].message == "SIGTERM on request, checkpointed and left: make room"
    assert len(list(job_dir.glob("preempt_request.*.withdrawn.json"))) == 1
    assert len(list(job_dir.glob("preempt_request.*.done.json"))) == 1


def test_a_request_withdrawn_after_the_trainer_claimed_it_still_reschedules(
        ett_home: Path) -> None:
    """The race the claim closes: the controller withdraws while the trainer, which found
    the request at a periodic save, is still saving (a slow save holds it there). The
    claim won: the withdrawal finds nothing, the task's watcher sees the request gone but
    claimed, so it stands: no restart in place, no failure, a reschedule."""
    from airflow.exceptions import AirflowRescheduleException

    from airflow_ett.operators.job import job_paths
    from airflow_ett.protocol.request import (
        CLAIMED_FILE,
        PreemptRequest,
        read_request,
        withdraw_request,
        write_request,
    )

    slow = [{"kind": "slow_save", "at_step": s, "seconds": 5.0} for s in range(50, 400, 50)]
    op = operator(restarts=1, config={"steps": 400, "step_sleep_s": 0.02,
                                      "checkpoint_interval": 50, "faults": slow})
    released: list[Any] = []
    withdrawn = op._request_withdrawn

    def release(request: Any) -> None:
        released.append(request)
        withdrawn(request)

    op._request_withdrawn = release  # type: ignore[method-assign]
    job = "ett_test__claimed"
    thread, outcome = execute_in_thread(op, "claimed", store=DictStateStore())
    thread.start()
    _trains(job, thread, outcome)
    job_dir = job_paths(ett_home / "ett_work", "ett_test", "claimed").job_dir
    asked = time.time()
    write_request(job_dir, PreemptRequest(
        victim=job, for_job="ads__r1", reason="make room", requested_at=asked,
        grace_s=30.0, resume_after_s=3.0, mode="at_checkpoint", leave_by=asked + 120.0))
    deadline = time.monotonic() + 60
    while not (job_dir / CLAIMED_FILE).exists():
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.05)
    assert withdraw_request(job_dir) is None  # the claim won the rename
    time.sleep(2.5)  # the watcher has looked: gone, but claimed
    assert thread.is_alive(), outcome  # still in its slow save
    thread.join(90)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), AirflowRescheduleException), outcome
    ended = [e for e in store_events(job) if isinstance(e, AttemptEnded)]
    assert [(e.attempt, e.cause) for e in ended] == [("1.1", "preemption")]  # no restart
    assert ended[0].message == "left at its checkpoint on request: make room"
    assert read_request(job_dir) is None and not (job_dir / CLAIMED_FILE).exists()
    assert len(list(job_dir.glob("preempt_request.*.done.json"))) == 1
    assert not list(job_dir.glob("preempt_request.*.withdrawn.json"))
    assert released == []  # the task never took the request for withdrawn


def test_the_watcher_holds_a_request_claimed_before_it_looked_and_puts_old_claims_aside(
        tmp_path: Path) -> None:
    """The trainer may claim a request between two looks (even leave on it): the watcher
    holds it all the same, and no restart in place follows a claim. A claimed file an
    earlier execution left is put aside before this one's trainer starts."""
    from airflow_ett.operators.request_watch import RequestWatcher
    from airflow_ett.operators.train import _StopLaunches
    from airflow_ett.protocol.request import (
        CLAIMED_FILE,
        PreemptRequest,
        claim_request,
        write_request,
    )

    def ask(at: float) -> PreemptRequest:
        request = PreemptRequest(victim="v", for_job="w", reason="r", requested_at=at,
                                 grace_s=30.0, mode="at_checkpoint", leave_by=at + 600)
        write_request(tmp_path, request)
        assert claim_request(tmp_path, since=0.0) == request
        return request

    ask(time.time() - 60)  # an earlier execution's
    held: list[Any] = []
    stop = _StopLaunches(tmp_path)
    with RequestWatcher(tmp_path, act=held.append, hold=held.append, poll_s=0.05) as watcher:
        assert not (tmp_path / CLAIMED_FILE).exists() and not stop.is_set()
        assert len(list(tmp_path.glob("preempt_request.*.done.json"))) == 1
        mine = ask(time.time())
        assert stop.is_set()  # no restart in place, whatever the watcher saw yet
        deadline = time.monotonic() + 10
        while not held:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)  # more looks: it stands, claimed (not released, not acted on)
    assert held == [mine] and watcher.request == mine and watcher.final_request() == mine


# -- multi-rank failures: the root-cause rank decides (trainer/rank_failures.py) ---------

def _multirank_failure(job: str, kind: str, raised: type[Exception]) -> tuple[Any, list[Any]]:
    """A 2-rank job whose rank 1 fails (`kind`) after step 3, no restart in place: the
    Airflow exception the task raises and the job's attempt_ended events in the store."""
    op = operator(nproc=2, restarts=0, config={
        "steps": 12, "faults": [{"kind": kind, "at_step": 3, "rank": 1}]})
    with pytest.raises(raised) as err:
        op.execute(context(job, max_tries=1))
    events = [e for e in store_events(f"ett_test__{job}") if isinstance(e, AttemptEnded)]
    return err.value, events


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")
def test_a_sigkilled_rank_is_an_infra_failure_for_airflow_and_for_the_ett(
        ett_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun exits 1 (its word for any failed rank), and rank 0 reports the error it
    got from its dead peer: the cause is still rank 1's SIGKILL, everywhere."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    error, ended = _multirank_failure("rank_kill", "kill", TrainerInfraFailure)
    assert error.exit_code == 1 and "rank 1: killed without a word" in str(error)
    infra = [e for e in ended if e.cause == "infra"]
    assert len(infra) == 1, ended  # the operator's, once: rank 1 could say nothing
    assert infra[0].message.startswith("rank 1: killed")
    summary = store_summary("ett_test__rank_kill")
    assert [a["cause"] for a in summary["attempts"]] == ["infra"]
    assert summary["nof"]["infra"] == 1 and summary["nof"]["total"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")
def test_a_rank_that_raises_is_an_application_error_for_airflow_and_for_the_ett(
        ett_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    error, ended = _multirank_failure("rank_raise", "raise", TrainerApplicationError)
    assert "rank 1: the training code raised (InjectedFault" in str(error)
    assert {e.cause for e in ended} == {"application"}, ended
    summary = store_summary("ett_test__rank_raise")
    assert [a["cause"] for a in summary["attempts"]] == ["application"]
    assert summary["nof"]["application"] == 1 and summary["nof"]["total"] == 1
    # every rank reports its own phases and end, tagged; rank 0 alone its progress
    events = store_events("ett_test__rank_raise")
    rank1 = [e for e in events if e.rank == 1]
    assert any(isinstance(e, PhaseStarted) and e.phase == "model_creation" for e in rank1)
    assert [e.message for e in rank1 if isinstance(e, AttemptEnded)] == [
        "InjectedFault: injected failure after step 3 (attempt 1)"]
    assert not [e for e in rank1 if isinstance(e, Progress)]
    # its own step times, flushed before the fault: steps 1-3, through the store
    assert [(e.step_start, e.step_end, e.v) for e in rank1 if isinstance(e, RankSteps)] == [
        (0, 3, 2)]
    # the attempt ends when its last rank does
    last_end = max(e.ts for e in ended)
    assert summary["attempts"][0]["end"] == pytest.approx(last_end)


def test_a_reschedule_date_never_overflows(tmp_path: Path) -> None:
    """`parse_request` bounds `resume_after_s` (a day at most); a request built some
    other way with 1e12 s must still reschedule, a day later, not raise OverflowError."""
    from datetime import UTC, datetime, timedelta

    from airflow.exceptions import AirflowRescheduleException

    from airflow_ett.operators.job import job_paths
    from airflow_ett.protocol.request import PreemptRequest

    op = operator(record=False)
    request = PreemptRequest(victim="v", for_job="w", reason="r", requested_at=time.time(),
                             grace_s=30.0, resume_after_s=1e12)
    before = datetime.now(UTC)
    with pytest.raises(AirflowRescheduleException) as err:
        op._rescheduled(context("big"), request, job_paths(tmp_path, "ett_test", "big"))
    assert before < err.value.reschedule_date <= datetime.now(UTC) + timedelta(days=1)
