"""Leaving when asked, as a process: an `at_checkpoint` preemption request makes an
attempt claim it and leave right after its next periodic save commits, saving nothing
more; SIGTERM right after a periodic save leaves without saving that step again; SIGTERM
with a `skip_save` request leaves without saving at all. Either way the resumed job ends
bitwise equal to one never interrupted (the resumed attempt re-trains from the newest
checkpoint, deterministically)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from airflow_ett.ett.events import AttemptEnded, CheckpointSaved, Event, read_events
from airflow_ett.protocol.exits import EXIT_OK, EXIT_PREEMPTED
from airflow_ett.protocol.request import (
    REQUEST_FILE,
    PreemptRequest,
    read_claimed,
    read_request,
    write_request,
)
from airflow_ett.trainer.checkpoint import read_marker
from airflow_ett.trainer.config import load_config
from airflow_ett.trainer.final_state import load_final_state
from tests.hostile import deep_json, fifo, not_utf8
from tests.trainer.test_trainer_e2e import write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT = 240


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


def assert_same_weights(want: dict[str, torch.Tensor], b: Path) -> None:
    got = load_final_state(load_config(b))
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs after the yield"


@pytest.fixture(scope="module")
def clean_weights(tmp_path_factory: pytest.TempPathFactory
                  ) -> Callable[[], dict[str, torch.Tensor]]:
    """`clean_weights()`: the final weights of `write_config`'s job trained once, without
    faults, requests or pacing, the first time a test asks. Every job compared with it
    here is that job: its step sleep and its checkpoint mode (in the background or not)
    change when it trains, never what, so one clean run serves them all (and a yielded
    job with background saves matching the clean run is part of what is checked)."""
    made: list[dict[str, torch.Tensor]] = []

    def weights() -> dict[str, torch.Tensor]:
        if not made:
            clean = write_config(tmp_path_factory.mktemp("clean") / "job.json")
            done = subprocess.run(command(clean, "clean", 1), capture_output=True,
                                  text=True, timeout=TIMEOUT, check=False, cwd=clean.parent)
            assert done.returncode == EXIT_OK, done.stderr[-3000:]
            made.append(load_final_state(load_config(clean)))
        return made[0]

    return weights


def test_an_at_checkpoint_request_leaves_right_after_the_next_periodic_save(
        tmp_path: Path, clean_weights: Callable[[], dict[str, torch.Tensor]]) -> None:
    config = write_config(tmp_path / "job" / "job.json", step_sleep_s=0.1)
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
    (ended,) = [e for e in events if isinstance(e, AttemptEnded) and not e.rank]
    assert (ended.cause, ended.exit_code) == ("preemption", EXIT_PREEMPTED)
    assert ended.message == f"left at its checkpoint on request: {reason}"
    # claimed before the save (a withdrawal now finds nothing), for the task to archive
    assert read_request(job_dir) is None
    claimed = read_claimed(job_dir)
    assert claimed is not None and claimed.requested_at == asked
    # the next attempt does not look at a claimed request: it trains to the end
    again = subprocess.run(command(config, "yield", 2), capture_output=True, text=True,
                           timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert again.returncode == EXIT_OK, again.stderr[-3000:]
    assert "restored step 20" in again.stderr
    assert saves(events_of(config), "2") == [30, 40, 50, 60]
    assert_same_weights(clean_weights(), config)


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


@pytest.mark.parametrize(("kind", "make"), [("not_utf8", not_utf8), ("deep", deep_json),
                                            ("fifo", fifo)])
def test_a_hostile_request_file_is_ignored_and_the_trainer_trains_on(
        tmp_path: Path, kind: str, make: Any) -> None:
    """A request file that is not UTF-8 or 5,000 levels deep crashed the trainer at every
    periodic save (and so every retry); a FIFO hung it. Each is one warning, logged once,
    and the attempt trains to the end."""
    config = write_config(tmp_path / "job" / "job.json", steps=30)
    job_dir = config.parent
    make(job_dir / REQUEST_FILE)
    done = subprocess.run(command(config, kind, 1), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    ignored = [line for line in done.stderr.splitlines() if REQUEST_FILE in line]
    assert len(ignored) == 1 and "ignored" in ignored[0], ignored


def test_sigterm_right_after_a_periodic_save_leaves_without_saving_again(
        tmp_path: Path, clean_weights: Callable[[], dict[str, torch.Tensor]]) -> None:
    config = write_config(tmp_path / "job" / "job.json",
                          faults=[{"kind": "sigterm", "at_step": 20, "attempt": 1}])
    job_dir = config.parent
    first = subprocess.run(command(config, "term", 1), capture_output=True, text=True,
                           timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    assert "step 20 is checkpointed already: no exit save" in first.stderr
    events = events_of(config)
    assert saves(events, "1") == [10, 20]  # one save of step 20, the periodic one
    (ended,) = [e for e in events if isinstance(e, AttemptEnded) and not e.rank]
    assert ended.cause == "preemption"
    second = subprocess.run(command(config, "term", 2), capture_output=True, text=True,
                            timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert second.returncode == EXIT_OK, second.stderr[-3000:]
    assert "restored step 20" in second.stderr
    assert_same_weights(clean_weights(), config)


def committed_steps(checkpoints: Path) -> list[int]:
    out = []
    for path in checkpoints.glob("step-*"):
        try:
            out.append(read_marker(path).step)
        except (OSError, ValueError):
            continue  # not committed
    return sorted(out)


@pytest.mark.parametrize("async_checkpoint", [False, True])
def test_sigterm_with_a_skip_save_request_leaves_at_once_without_saving(
        tmp_path: Path, async_checkpoint: bool,
        clean_weights: Callable[[], dict[str, torch.Tensor]]) -> None:
    """The controller knows the exit save would not fit the grace: SIGTERM at step 21
    leaves right after that step, no save begun, the next attempt restores the newest
    committed checkpoint and re-trains from it. Saves made synchronously: that is the
    periodic one at step 20. Made in the background, step 20's may still be in flight
    then: it is not waited for (the process exits under it), and step 10 resumes
    (or step 20, if its write landed before the exit all the same)."""
    config = write_config(tmp_path / "job" / "job.json",
                          optimizations={"async_checkpoint": async_checkpoint},
                          faults=[{"kind": "sigterm", "at_step": 21, "attempt": 1}])
    job_dir = config.parent
    reason = "preempted unsaved: its exit save of 5 min does not fit the grace"
    write_request(job_dir, PreemptRequest(victim="unsaved", for_job="ads__r1", reason=reason,
                                          requested_at=time.time(), grace_s=30.0,
                                          skip_save=True))
    first = subprocess.run(command(config, "unsaved", 1), capture_output=True, text=True,
                           timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    assert "leaving at step 21 without saving, as asked" in first.stderr
    events = events_of(config)
    newest = committed_steps(job_dir / "ckpt")[-1]
    assert saves(events, "1") == list(range(10, newest + 1, 10))  # nothing at step 21
    in_flight = "without waiting for the checkpoint in flight" in first.stderr
    # Not waited for, step 20's background write may still land before the process is
    # gone (seen under load); waited for, it always has.
    assert newest in ((10, 20) if in_flight else (20,))
    if not async_checkpoint:
        assert not in_flight
    (ended,) = [e for e in events if isinstance(e, AttemptEnded) and not e.rank]
    assert (ended.cause, ended.exit_code) == ("preemption", EXIT_PREEMPTED)
    assert ended.message == ("SIGTERM on request, left without saving (its exit save would "
                             f"not fit the 30 s grace): {reason}")
    second = subprocess.run(command(config, "unsaved", 2), capture_output=True, text=True,
                            timeout=TIMEOUT, check=False, cwd=job_dir, env=env_for(job_dir))
    assert second.returncode == EXIT_OK, second.stderr[-3000:]
    assert f"restored step {newest}" in second.stderr
    assert saves(events_of(config), "2") == list(range(newest + 10, 61, 10))
    assert_same_weights(clean_weights(), config)


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(
    sys.executable).with_name("torchrun").exists(), reason="torchrun not installed")
def test_under_torchrun_every_rank_leaves_on_the_same_checkpoint(tmp_path: Path) -> None:
    """Rank 0 reads the request, the checkpoint group carries its verdict: both ranks
    leave after the same save (no hang), and the claimed request tells the task, torchrun
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
    claimed = read_claimed(job_dir)  # what tells the task, torchrun hiding the exit 75
    assert claimed is not None and claimed.requested_at == asked
    events = events_of(config)
    steps = saves(events, "1")
    assert steps == list(range(5, steps[-1] + 1, 5)) and steps[-1] < 400
    (ended,) = [e for e in events if isinstance(e, AttemptEnded) and not e.rank]
    assert (ended.cause, ended.message) == ("preemption",
                                            "left at its checkpoint on request: make room")


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(
    sys.executable).with_name("torchrun").exists(), reason="torchrun not installed")
def test_under_torchrun_every_rank_leaves_without_saving_on_a_skip_save_request(
        tmp_path: Path) -> None:
    """Rank 0 reads the request on SIGTERM and every rank gets its verdict (over the
    checkpoint group, or the default one while a save is in flight): both leave at the
    same step without saving, and nobody hangs."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    config = write_config(tmp_path / "job" / "job.json", steps=400, checkpoint_interval=5,
                          faults=[{"kind": "sigterm", "at_step": 11, "attempt": 1}])
    job_dir = config.parent  # step 10's save likely still in flight at step 11
    write_request(job_dir, PreemptRequest(victim="ddp", for_job="ads__r1", reason="room",
                                          requested_at=time.time(), grace_s=30.0,
                                          skip_save=True))
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", *command(config, "ddp", 1)[1:]],
        capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=job_dir,
        env={**env_for(job_dir), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr[-3000:]  # torchrun's word for a rank's 75
    assert done.stderr.count("leaving at step 11 without saving, as asked") == 2
    events = events_of(config)
    assert saves(events, "1") in ([5], [5, 10])  # step 10's may have been in flight
    assert committed_steps(job_dir / "ckpt")[-1] == saves(events, "1")[-1]
    (ended,) = [e for e in events if isinstance(e, AttemptEnded) and not e.rank]
    assert ended.message is not None and "left without saving" in ended.message
