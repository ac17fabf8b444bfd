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


def run_job(directory: Path, job: str, *, max_attempts: int = 5, prewarm: bool = False,
            ) -> tuple[LaunchResult, JobAttribution]:
    """Submit, run attempts until success, end; each run with its own cold inductor dir
    so that warmth can only come from the compile cache under test."""
    config = directory / "job.json"
    env = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
    if prewarm:
        run_attempts(config, f"{job}-prewarm", max_attempts=1, cwd=directory, env=env,
                     extra_args=["--prewarm"], stdout=(directory / "prewarm.log").open("w"))
        env = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
    record(directory, job, None, "job_submitted", tenant="bench", model="dlrm_small")

    def report(outcome: AttemptOutcome) -> None:
        record(directory, job, outcome.attempt_id, "attempt_ended",
               status=outcome.exit_class.status, cause=outcome.exit_class.cause,
               exit_code=outcome.exit_code)

    with (directory / "trainer.log").open("a") as log:
        result = run_attempts(config, job, max_attempts=max_attempts, cwd=directory, env=env,
                              stdout=log, report_unreported=report)
    record(directory, job, None, "job_ended",
           status="success" if result.succeeded else "failed")
    events = [e for e in read_events(str(directory / "events.jsonl")).events if e.job == job]
    return result, attribute_job(events)
