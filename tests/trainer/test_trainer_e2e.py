"""The trainer as a process, the way the operator runs it: attempts one after another,
each a fresh `python -m airflow_ett.trainer`, with the harness playing the operator's
part (it reports what a killed process cannot, as the operator will)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import read_events
from airflow_ett.protocol.exits import (
    EXIT_APPLICATION,
    EXIT_BAD_CONFIG,
    EXIT_HUNG,
    EXIT_OK,
)
from airflow_ett.trainer.config import load_config
from airflow_ett.trainer.final_state import load_final_state
from airflow_ett.trainer.launcher import AttemptOutcome, run_attempts
from tests.trainer._stacks import run_or_show_stacks

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


def run_attempt(config: Path, job: str, number: int, *extra: str,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_or_show_stacks(
        [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config),
         "--job-id", job, "--attempt-number", str(number), *extra],
        timeout=TIMEOUT, env={**os.environ, **(env or {})}, cwd=config.parent)


def operator_says(config: Path, job: str, **call: Any) -> None:
    """What the operator records around the trainer (job submitted, a killed attempt)."""
    cfg = load_config(config)
    assert cfg.events_file is not None
    emitter = Emitter(job, call.pop("attempt", None), sink=JsonlSink(cfg.events_file),
                      replay_on_start=False)
    getattr(emitter, call.pop("what"))(**call)
    assert emitter.close()


def run_job(config: Path, job: str, expected_codes: list[int]) -> list[str]:
    """Attempts through the launcher the operator uses, restarting in place."""
    operator_says(config, job, what="job_submitted", tenant="t", model="dlrm_tiny")

    def report(outcome: AttemptOutcome) -> None:  # a SIGKILLed attempt said nothing
        operator_says(config, job, what="attempt_ended", attempt=outcome.attempt_id,
                      status=outcome.exit_class.status, cause=outcome.exit_class.cause,
                      exit_code=outcome.exit_code)

    logs = []
    with (config.parent / "trainer.log").open("w+") as log:
        result = run_attempts(config, job, max_attempts=len(expected_codes), cwd=config.parent,
                              stdout=log, report_unreported=report, timeout=TIMEOUT)
        log.seek(0)
        logs.append(log.read())
    assert [a.exit_code for a in result.attempts] == expected_codes, logs[-1][-4000:]
    operator_says(config, job, what="job_ended", status="success")
    return logs


def test_two_failures_and_restores_end_bitwise_equal_to_a_clean_run(tmp_path: Path) -> None:
    clean = write_config(tmp_path / "clean" / "job.json")
    faulty = write_config(tmp_path / "faulty" / "job.json", faults=[
        {"kind": "raise", "at_step": 25, "attempt": 1},
        {"kind": "kill", "at_step": 45, "attempt": 2},
    ])
    run_job(clean, "clean", [EXIT_OK])
    logs = run_job(faulty, "faulty", [EXIT_APPLICATION, -9, EXIT_OK])
    assert "InjectedFault" in logs[0] and "fault injection: kill after step 45" in logs[0]

    want = load_final_state(load_config(clean))
    got = load_final_state(load_config(faulty))
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs after the restores"

    result = attribute_job(read_events(str(tmp_path / "faulty" / "events.jsonl")).events)
    d = result.to_dict()
    assert d["nof"]["total"] == 2
    assert d["nof"]["application"] == 1 and d["nof"]["infra"] == 1
    assert d["phases"].get("replay", 0) > 0
    assert len(d["ttr_s"]) == 2
    assert d["provisional"] is False
    assert d["attempts"][-1]["status"] == "success"
    for phase in ("trainer_init", "model_creation", "data_pipeline_init",
                  "checkpoint_restore", "final_checkpoint", "teardown"):
        assert phase in d["phases_raw"], phase
    clean_d = attribute_job(read_events(str(tmp_path / "clean" / "events.jsonl")).events)
    assert clean_d.nof["total"] == 0 and "replay" not in clean_d.phases_us


def test_corrupt_newest_checkpoints_fall_back_to_the_last_valid_one(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json", steps=30, keep_last=3)
    assert run_attempt(config, "corrupt", 1).returncode == EXIT_OK
    ckpt = tmp_path / "ckpt"
    steps = sorted(p for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert [p.name for p in steps] == [f"step-{n:010d}" for n in (10, 20, 30)]
    (steps[2] / "COMMITTED.json").unlink()  # the newest never committed
    data = sorted(f for f in steps[1].iterdir() if f.suffix == ".distcp")
    data[0].write_bytes(data[0].read_bytes()[:10])  # the next one is truncated
    done = run_attempt(write_config(tmp_path / "job.json", steps=40, keep_last=3),
                       "corrupt", 2)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert steps[1].name in done.stderr and "skipped" in done.stderr
    assert "restored step 10" in done.stderr


def test_bad_config_fails_fast_with_its_own_exit_code(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json", steps=0)
    done = run_attempt(config, "bad", 1)
    assert done.returncode == EXIT_BAD_CONFIG
    assert "steps = 0: must be >= 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigterm_checkpoints_and_exits_resumable(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json", steps=100_000, step_sleep_s=0.01,
                          checkpoint_interval=100_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config),
         "--job-id", "pre", "--attempt-number", "1"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stderr is not None
    deadline = time.monotonic() + TIMEOUT
    for line in proc.stderr:  # wait until it trains
        if ("step " in line and "samples/s" in line) or time.monotonic() > deadline:
            break
    proc.terminate()
    rest = proc.communicate(timeout=TIMEOUT)[1]
    assert proc.returncode == 75, rest[-2000:]
    assert (tmp_path / "ckpt").is_dir()
    assert any((p / "COMMITTED.json").exists() for p in (tmp_path / "ckpt").iterdir())
    events = read_events(str(tmp_path / "events.jsonl")).events
    d = attribute_job(events, now=time.time()).to_dict()
    assert d["attempts"][0]["cause"] == "preemption"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="torch.compile on CPU needs gcc")
def test_a_prewarmed_cache_is_hit_by_the_next_job(tmp_path: Path) -> None:
    """The prewarm saves the compile cache; a job in a fresh process (nothing host-wide
    to reuse) restores it and inductor reuses its files. How much faster that starts
    than a cold compile is a speed figure: `bench/compile_cache.py` and
    `bench.time_to_start` measure it (bench/RESULTS.md)."""
    prewarm = write_config(tmp_path / "warm" / "job.json", compile=True,
                           compile_cache_dir="cache", steps=5, checkpoint_interval=100)

    def isolated(name: str) -> dict[str, str]:
        """Its own TMPDIR (the cache's local dir lives there) and inductor dir: warmth
        can only come from the shared compile cache."""
        (tmp_path / name).mkdir()
        return {"TMPDIR": str(tmp_path / name),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name / "inductor")}

    pre = run_attempt(prewarm, "prewarm", 1, "--prewarm", env=isolated("tmp-prewarm"))
    assert pre.returncode == EXIT_OK, pre.stderr[-3000:]
    assert "prewarm: cache saved" in pre.stderr

    done = run_attempt(prewarm, "warm", 1, env=isolated("tmp-warm"))
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "compile cache hit" in done.stderr
    # every compiled forward came from the entry, compiled ahead of time: nothing traced,
    # nothing compiled here (compile_cache/precompiled.py)
    counters = re.search(r"graphs (\d+), .* precompiled loaded (\d+), compiled (\d+)",
                         done.stderr)
    assert counters is not None, done.stderr[-2000:]
    assert (int(counters[1]), int(counters[3])) == (0, 0) and int(counters[2]) > 0, \
        done.stderr[-2000:]
    warm = attribute_job([e for e in read_events(str(tmp_path / "warm" / "events.jsonl")).events
                          if e.job == "warm"])
    assert warm.phases_raw_us["compile"] > 0
    # torch's compiler was imported on a thread once the data pipeline had started, and
    # the compile waited for what was left of it (compile_cache/inductor.py)
    assert "compiler import ahead: " in done.stderr, done.stderr[-2000:]


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(
    sys.executable).with_name("torchrun").exists(), reason="torchrun not installed")
def launch_two(config: Path, number: int) -> subprocess.CompletedProcess[str]:
    """Attempt `number` of job "ddp" as two processes under torchrun."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return run_or_show_stacks(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "airflow_ett.trainer",
         "--config", str(config), "--job-id", "ddp", "--attempt-number", str(number)],
        timeout=TIMEOUT, cwd=config.parent, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_two_processes_shard_train_checkpoint_and_resume(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json", steps=20, checkpoint_interval=5,
                          faults=[{"kind": "raise", "at_step": 12, "attempt": 1}])
    first = launch_two(config, 1)
    assert first.returncode != 0, first.stderr[-3000:]
    second = launch_two(config, 2)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "restored step 10" in second.stderr
    d = attribute_job(read_events(str(tmp_path / "events.jsonl")).events).to_dict()
    assert d["nof"]["total"] == 1
    assert d["attempts"][-1]["status"] == "success"
    assert d["phases"].get("replay", 0) > 0


def test_hang_stops_progress_until_killed_and_auto_interval_is_chosen(tmp_path: Path) -> None:
    # hangs after 13 s of steps: after the first auto save (10 s) and the steps beside it
    config = write_config(tmp_path / "job.json", steps=1000, checkpoint_interval="auto",
                          step_sleep_s=0.05, faults=[{"kind": "hang", "at_step": 260}])
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config),
         "--job-id", "hang", "--attempt-number", "1"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + TIMEOUT
    for line in proc.stderr:
        seen.append(line)
        if "fault injection: hang after step 260" in line or time.monotonic() > deadline:
            break
    time.sleep(2.0)  # hung: alive, no progress; the recorder still writes what it has
    assert proc.poll() is None, "".join(seen)[-2000:]
    # asked where it stands, it says (every thread's stack) and goes on hanging
    proc.send_signal(signal.SIGUSR1)
    dumped = []
    for line in proc.stderr:
        dumped.append(line)
        if re.search(r'faults\.py", line \d+ in after_step', line) or (
                time.monotonic() > deadline):
            break
    assert "Current thread" in "".join(dumped) and "in after_step" in dumped[-1], dumped
    assert proc.poll() is None
    proc.kill()
    proc.communicate(timeout=60)
    log = "".join(seen)
    # nothing trained yet: the floor of an unmeasured save's cost (1 s a save, a tenth)
    assert "checkpoint interval auto: 10.0s (min; CSBT 1.000s, MTBF unknown)" in log, log
    # the first save measured beside the steps it slowed; the interval chosen from that
    chosen = re.search(r"checkpoint interval auto: ([0-9.]+)s \(\w+; cost ([0-9.]+)s = "
                       r"blocking ([0-9.]+)s \+ slowdown ([0-9.]+)s, MTBF \d+s\)", log)
    assert chosen is not None, log[-3000:]
    cost, blocking, slowdown = (float(chosen.group(i)) for i in (2, 3, 4))
    assert cost == pytest.approx(blocking + slowdown, abs=2e-3)
    assert float(chosen.group(1)) < 30.0  # the old fixed floor: a cheap save, a short one
    events = read_events(str(tmp_path / "events.jsonl")).events
    steps = [e.step_end for e in events if type(e).__name__ == "Progress"]
    assert max(steps) == 260
    d = attribute_job(events, now=time.time()).to_dict()
    assert d["attempts"][0]["status"] == "running"  # nobody told it ended: still going


def test_an_attempt_with_its_own_events_file_leaves_the_hosts_spool_alone(
        tmp_path: Path) -> None:
    # Another job's event waits in the host's spool (its store was down). An attempt
    # writing to an events file must not replay it there: the file is one job's record.
    spool = tmp_path / "spool"
    with Emitter("other-job", "1", sink=f"sqlite:///{tmp_path}/no/such/dir.db",
                 spool_dir=spool, emit_timeout=1.0) as other:
        other.job_submitted(tenant="t")
    spooled = sorted(p.name for p in spool.iterdir())
    assert spooled
    config = write_config(tmp_path / "job" / "job.json", steps=4)
    done = run_attempt(config, "mine", 1, env={"AIRFLOW__ETT__SPOOL_DIR": str(spool)})
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    jobs = {e.job for e in read_events(str(tmp_path / "job" / "events.jsonl")).events}
    assert jobs == {"mine"}
    assert sorted(p.name for p in spool.iterdir()) == spooled


def test_a_hang_is_detected_by_the_watchdog_and_restarted(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json", hang_timeout_s=3.0,
                          faults=[{"kind": "hang", "at_step": 20, "attempt": 1}])
    logs = run_job(config, "hung", [EXIT_HUNG, EXIT_OK])
    assert "hang: no step finished for" in logs[0]
    d = attribute_job(read_events(str(tmp_path / "events.jsonl")).events).to_dict()
    (failure,) = d["failures"]
    assert failure["cause"] == "infra" and d["nof"]["infra"] == 1
    # From the last progress to the watchdog's notice: the timeout, spent hung.
    assert d["phases"]["detection"] >= 3.0
    assert d["attempts"][-1]["status"] == "success"
