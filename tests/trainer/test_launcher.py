"""How an attempt's exit is read: what a restart can heal, and who reports it."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from airflow_ett.protocol.exits import classify_exit
from airflow_ett.trainer.launcher import run_attempts, trainer_command
from tests.proc_tree import TreeRecorder, still_running


@pytest.mark.parametrize(
    ("code", "status", "cause", "retryable", "reported"),
    [
        (0, "success", None, False, True),
        (1, "failed", "application", True, True),
        (75, "failed", "preemption", True, True),
        (78, "failed", "application", False, True),
        (70, "failed", "infra", True, True),  # hung: its watchdog reported and left
        (-signal.SIGKILL, "failed", "infra", True, False),
        (128 + signal.SIGKILL, "failed", "infra", True, False),
        (-signal.SIGSEGV, "failed", "infra", True, False),
        (-signal.SIGTERM, "failed", "preemption", True, False),
        (3, "failed", "unknown", True, False),
    ],
)
def test_classify_exit(code: int, status: str, cause: str | None, retryable: bool,
                       reported: bool) -> None:
    got = classify_exit(code)
    assert (got.status, got.cause, got.retryable, got.reported_by_child) == (
        status, cause, retryable, reported)


def test_commands() -> None:
    assert trainer_command("job.toml", python="/v/bin/python") == [
        "/v/bin/python", "-m", "airflow_ett.trainer", "--config", "job.toml"]
    cmd = trainer_command("job.toml", nproc=2, prewarm=True, python="/v/bin/python")
    assert cmd[:4] == ["/v/bin/torchrun", "--standalone", "--nproc-per-node", "2"]
    assert cmd[-1] == "--prewarm"
    with pytest.raises(ValueError, match="max_attempts = 0"):
        run_attempts("job.toml", "j", max_attempts=0)


TORCHRUN = Path(sys.executable).with_name("torchrun")
# Both ranks stop making progress after this step and never leave: SIGTERM only sets the
# trainer's preemption flag, which a hung loop never reads.
HANG = {"model": "dlrm_tiny", "steps": 1000, "batch_size": 64, "checkpoint_dir": "ckpt",
        "checkpoint_interval": 1000, "num_workers": 0, "compile": False,
        "events_file": "events.jsonl", "log_every_s": 1.0, "seed": 3,
        "faults": [{"kind": "hang", "at_step": 3}]}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")
def test_an_attempt_timeout_kills_every_process_of_a_torchrun_job(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own: killing torchrun alone would
    leave both ranks running (hung, holding their GPUs) after the attempt 'ended'."""
    config = tmp_path / "job.json"
    config.write_text(json.dumps(HANG))
    lines: list[str] = []
    with TreeRecorder() as recorder:
        result = run_attempts(
            config, "hang-timeout", max_attempts=1, nproc=2, cwd=tmp_path, timeout=30.0,
            env={"OMP_NUM_THREADS": "1"}, on_start=lambda proc, _n, _a: recorder.watch(proc),
            on_output=lines.append)
        left = still_running(recorder.starts)
        ranks = recorder.matching("-m airflow_ett.trainer")
    log = "\n".join(lines)[-3000:]
    assert log.count("fault injection: hang after step 3") == 2, log  # both ranks hung
    assert result.last.exit_code == -signal.SIGKILL, log
    assert result.last.exit_class.description == "killed by SIGKILL"
    top = result.last
    assert len(ranks) >= 3, recorder.processes  # torchrun itself, and its two ranks
    sessions = {sid for _start, sid, _cmd in ranks.values()}
    assert len(sessions) >= 3, "the ranks were expected in sessions of their own"
    assert left == {}, f"attempt {top.attempt_id} left {left}"
