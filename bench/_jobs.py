"""Shared by the trainer benchmarks: write a config, run a job's attempts through the
launcher the operator uses, and read its ETT back from the events it wrote."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.events import read_events
from airflow_ett.trainer.launcher import AttemptOutcome, LaunchResult, run_attempts


def write_config(directory: Path, **fields: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"checkpoint_dir": "ckpt", "events_file": "events.jsonl", "log_every_s": 30.0,
              **fields}
    path = directory / "job.json"
    path.write_text(json.dumps(config))
    return path


def record(directory: Path, job: str, attempt: str | None, what: str, **call: Any) -> None:
    emitter = Emitter(job, attempt, sink=JsonlSink(directory / "events.jsonl"),
                      replay_on_start=False)
    getattr(emitter, what)(**call)
    emitter.close()


def fresh_host_env() -> dict[str, str]:
    """A process that finds no compile output of earlier ones on its host: its own TMPDIR
    (where the compile cache unpacks) and inductor dir. Warmth can then only come from
    the shared compile cache under test, as when a restart lands on another host."""
    tmp = tempfile.mkdtemp(prefix="bench-host-")
    return {"TMPDIR": tmp, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}


def run_job(directory: Path, job: str, *, max_attempts: int = 5, prewarm: bool = False,
            in_place: bool = False, warm_standby: bool = False,
            ) -> tuple[LaunchResult, JobAttribution]:
    """Submit, run attempts (each on a 'fresh host') until success, end. `in_place`:
    restarts on the same host, by the launcher as the train task restarts a trainer
    (with `warm_standby`, handed over to the spare it keeps)."""
    config = directory / "job.json"
    if prewarm:
        with (directory / "prewarm.log").open("w") as log:
            run_attempts(config, f"{job}-prewarm", max_attempts=1, cwd=directory,
                         env=fresh_host_env(), extra_args=["--prewarm"], stdout=log)
    record(directory, job, None, "job_submitted", tenant="bench", model="dlrm_small")

    def report(outcome: AttemptOutcome) -> None:
        record(directory, job, outcome.attempt_id, "attempt_ended",
               status=outcome.exit_class.status, cause=outcome.exit_class.cause,
               exit_code=outcome.exit_code)

    result = LaunchResult()
    with (directory / "trainer.log").open("a") as log:
        if in_place:
            result = run_attempts(config, job, max_attempts=max_attempts, cwd=directory,
                                  env=fresh_host_env(), stdout=log, report_unreported=report,
                                  warm_standby=warm_standby)
        else:
            for number in range(1, max_attempts + 1):
                one = run_attempts(config, job, max_attempts=1, first_attempt=number,
                                   cwd=directory, env=fresh_host_env(), stdout=log,
                                   report_unreported=report)
                result.attempts.extend(one.attempts)
                if one.succeeded or not one.last.exit_class.retryable:
                    break
    record(directory, job, None, "job_ended",
           status="success" if result.succeeded else "failed")
    events = [e for e in read_events(str(directory / "events.jsonl")).events if e.job == job]
    return result, attribute_job(events)
