"""Leaving when asked, as a process: an `at_checkpoint` preemption request makes an
attempt leave right after its next periodic save commits, saving nothing more; SIGTERM
right after a periodic save leaves without saving that step again. Either way the resumed
job ends bitwise equal to one never interrupted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from airflow_ett.ett.events import AttemptEnded, CheckpointSaved, Event, read_events
from airflow_ett.scheduling.request import PreemptRequest, write_request
from airflow_ett.trainer.config import load_config
from airflow_ett.trainer.faults import EXIT_OK, EXIT_PREEMPTED
from airflow_ett.trainer.loop import load_final_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT = 240


def write_config(path: Path, **fields: Any) -> Path:
    base: dict[str, Any] = {
        "model": "dlrm_tiny", "steps": 60, "batch_size": 64, "checkpoint_dir": "ckpt",
        "checkpoint_interval": 10, "num_workers": 0, "compile": False,
        "events_file": "events.jsonl", "log_every_s": 1.0, "seed": 11,
    }
    base.update(fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(base))
    return path


def command(config: Path, job: str, number: int) -> list[str]:
    return [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config), "--job-id",
            job, "--attempt-number", str(number)]


def env_for(job_dir: Path) -> dict[str, str]:
    return {**os.environ, "ETT_JOB_DIR": str(job_dir)}


def events_of(config: Path) -> list[Event]:
    result = read_events(str(config.parent / "events.jsonl"))
    assert not result.errors
    return result.events


def saves(events: list[Event], attempt: str) -> list[int]:
    return [e.step for e in events if isinstance(e, CheckpointSaved) and e.attempt == attempt]


def assert_same_weights(a: Path, b: Path) -> None:
    want, got = load_final_state(load_config(a)), load_final_state(load_config(b))
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs after the yield"


def clean_run(tmp_path: Path, **fields: Any) -> Path:
    clean = write_config(tmp_path / "clean" / "job.json", **fields)
    done = subprocess.run(command(clean, "clean", 1), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False, cwd=clean.parent)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    return clean


def test_an_at_checkpoint_request_leaves_right_after_the_next_periodic_save(
        tmp_path: Path) -> None:
    fields: dict[str, Any] = {"step_sleep_s": 0.1}
    config = write_config(tmp_path / "job" / "job.json", **fields)
    job_dir = config.parent
    proc = subprocess.Popen(command(config, "yield", 1), stderr=subprocess.PIPE, text=True,
                            cwd=job_dir, env=env_for(job_dir))
    assert proc.stderr is not None
    deadline = time.monotonic() + TIMEOUT
    for line in proc.stderr:  # wait for the first periodic save to commit
        if "checkpoint step 10 committed" in line or time.monotonic() > deadline:
            break
    reason = "preempted yield: tenant batch over its guarantee by 1 GPU"
    asked = time.time()
    write_request(job_dir, PreemptRequest(
        victim="yield", for_job="ads__r1", reason=reason, requested_at=asked, grace_s=30.0,
        mode="at_checkpoint", leave_by=asked + 60.0))
    rest = proc.communicate(timeout=TIMEOUT)[1]
    assert proc.returncode == EXIT_PREEMPTED, rest[-3000:]
    assert "preemption at checkpoint step 20" in rest
    events = events_of(config)
    # left on the save at step 20, the first after the request: no exit save
    assert saves(events, "1") == [10, 20]
    (ended,) = [e for e in events if isinstance(e, AttemptEnded)]
    assert (ended.cause, ended.exit_code) == ("preemption", EXIT_PREEMPTED)
    assert ended.message == f"left at its checkpoint on request: {reason}"
    note = json.loads((job_dir / "preempt_left.json").read_text())  # for the task
    assert (note["requested_at"], note["step"]) == (asked, 20)
    # the request is still there: the next attempt started after it, so it is not its own
    again = subprocess.run(command(config, "yield", 2), capture_output=True, text=True,
                           timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert again.returncode == EXIT_OK, again.stderr[-3000:]
    assert "restored step 20" in again.stderr
    assert saves(events_of(config), "2") == [30, 40, 50, 60]
    assert_same_weights(clean_run(tmp_path, **fields), config)


def test_a_now_request_is_not_acted_on_at_a_checkpoint(tmp_path: Path) -> None:
    """A `now` request is the task's to act on (SIGTERM), never the trainer's: alone, the
    trainer trains to the end."""
    config = write_config(tmp_path / "job" / "job.json", steps=30)
    job_dir = config.parent
    later = time.time() + 3600  # made after the attempt starts
    write_request(job_dir, PreemptRequest(victim="v", for_job="w", reason="r",
                                          requested_at=later, grace_s=30.0))
    done = subprocess.run(command(config, "now", 1), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert done.returncode == EXIT_OK, done.stderr[-3000:]


def test_sigterm_right_after_a_periodic_save_leaves_without_saving_again(
        tmp_path: Path) -> None:
    fields: dict[str, Any] = {}
    config = write_config(tmp_path / "job" / "job.json",
                          faults=[{"kind": "sigterm", "at_step": 20, "attempt": 1}])
    job_dir = config.parent
    first = subprocess.run(command(config, "term", 1), capture_output=True, text=True,
                           timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    assert "step 20 is checkpointed already: no exit save" in first.stderr
    events = events_of(config)
    assert saves(events, "1") == [10, 20]  # one save of step 20, the periodic one
    (ended,) = [e for e in events if isinstance(e, AttemptEnded)]
    assert ended.cause == "preemption"
    second = subprocess.run(command(config, "term", 2), capture_output=True, text=True,
                            timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert second.returncode == EXIT_OK, second.stderr[-3000:]
    assert "restored step 20" in second.stderr
    assert_same_weights(clean_run(tmp_path, **fields), config)


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(
    sys.executable).with_name("torchrun").exists(), reason="torchrun not installed")
def test_under_torchrun_every_rank_leaves_on_the_same_checkpoint(tmp_path: Path) -> None:
    """Rank 0 reads the request, the checkpoint group carries its verdict: both ranks
    leave after the same save (no hang), and rank 0 notes it for the task, torchrun
    turning the ranks' exit 75 into its own 1."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    config = write_config(tmp_path / "job" / "job.json", steps=400, checkpoint_interval=5,
                          step_sleep_s=0.05)
    job_dir = config.parent
    proc = subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node", "2", *command(config, "ddp", 1)[1:]],
        stderr=subprocess.PIPE, text=True, cwd=job_dir,
        env={**env_for(job_dir), "OMP_NUM_THREADS": "1"})
    assert proc.stderr is not None
    deadline = time.monotonic() + TIMEOUT
    for line in proc.stderr:
        if "checkpoint step 10 committed" in line or time.monotonic() > deadline:
            break
    asked = time.time()
    write_request(job_dir, PreemptRequest(
        victim="ddp", for_job="ads__r1", reason="make room", requested_at=asked,
        grace_s=30.0, mode="at_checkpoint", leave_by=asked + 60.0))
    rest = proc.communicate(timeout=TIMEOUT)[1]
    assert proc.returncode == 1, rest[-3000:]  # torchrun's word for a rank's exit 75
    note = json.loads((job_dir / "preempt_left.json").read_text())
    events = events_of(config)
    steps = saves(events, "1")
    assert steps == list(range(5, steps[-1] + 1, 5)) and steps[-1] == note["step"] < 400
    (ended,) = [e for e in events if isinstance(e, AttemptEnded)]
    assert (ended.cause, ended.message) == ("preemption",
                                            "left at its checkpoint on request: make room")
