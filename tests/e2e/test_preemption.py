"""Preemption end to end on a real Airflow (scheduler, dag-processor, API server; SQLite,
LocalExecutor with one slot: the fleet's only GPU) with the real trainer.

A preemptible low-priority job (tenant `batch`, borrowing the GPU) trains; a
high-priority job (tenant `ads`, whose guarantee it is) arrives and waits for the slot.
The controller (`airflow-ett preemption run --once`, as a platform team runs it) chooses
the low job and, its periodic saves showing when the next one comes, asks it to yield at
that checkpoint; it leaves right after it (no exit save) and reschedules itself (no retry
spent), the high job runs and finishes, the low job resumes from its checkpoint and
finishes. Its final weights are bitwise those of the same job trained without a
preemption, its ETT shows the preemption (cause, the decision's reason) and a TTR, and the
train task of each job ran in its tenant's pool with its slots (the cluster policy).
Before that, while the low job is still in startup, and while it is in the middle of a
(slow) checkpoint save, it is not chosen; and once the tenants file makes the GPU the low
tenant's guarantee, it is not touched at all.

Both DAGs are train-only lifecycle jobs (no prewarm, publish inside the train task), so
that the one executor slot is exactly the GPU.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_ett.embedded import EmbeddedAirflow, venv_script
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    JobEnded,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore, upgrade
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER
from tests.reference_run import assert_same_weights, reference_weights

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

TENANTS = """
[scheduling]
capacity_gpus = 1
preemption = true
# Below the scheduler's lag in handling the executor's event for the rescheduled try,
# Airflow finds the task queued again and counts that event as a failed try (a retry
# spent): 5 s did so once on a loaded machine (2026-12-02; see the tenants docs).
resume_after_s = 15
aging_per_hour = 0

[tenants.batch]
priority = 1
quota_gpus = 0
borrow_limit_gpus = 1
min_run_s = 0
grace_s = 60
max_preemptions_per_day = 3

[tenants.ads]
priority = 10
quota_gpus = 1
preemptible = false
"""

TRAINER = {"compile": False, "num_workers": 0, "batch_size": 64, "seed": 5,
           "log_every_s": 1.0}
DAGS = f'''# two lifecycle DAGs (Airflow parses a file only if it says "airflow" and "DAG")
from airflow_ett.operators import training_job

OPTS = {{"compile_cache": False, "standalone_publish": False, "warm_standby": False}}
# the data pipeline takes 15 s to start: the job is in startup meanwhile; then it saves
# every 30 steps (about 3 s), so that its cadence is known when the controller looks; its
# third save, on its first attempt, is slow (20 s: slow storage), so that it is caught
# mid-save
low = training_job("pre_low", model="dlrm_tiny", steps=300, tenant="batch", retries=1,
                   checkpoint_interval=30, optimizations=OPTS,
                   faults=[{{"kind": "slow_save", "at_step": 90, "attempt": 1}}],
                   trainer_options={{**{TRAINER!r}, "step_sleep_s": 0.1,
                                    "data_startup_latency_s": 15.0}})
high = training_job("pre_high", model="dlrm_tiny", steps=20, tenant="ads", retries=1,
                    checkpoint_interval=1000, optimizations=OPTS, trainer_options={TRAINER!r})
'''


def _ti(af: EmbeddedAirflow, dag_id: str, run_id: str) -> dict[str, Any]:
    body = af.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
    (ti,) = body["task_instances"]
    return dict(ti)


def _events(url: str, job: str) -> list[Any]:
    with EttStore(url) as store:
        return store.job_events(job)


def _wait(what: str, check: Any, af: EmbeddedAirflow, timeout: float = 240.0) -> Any:
    return af.wait_until(what, check, timeout)


def _saving(events: list[Any]) -> bool:
    """A periodic save of the job has begun and not ended (its phase is open)."""
    marks = [e for e in events if isinstance(e, PhaseStarted | PhaseEnded)
             and e.phase == "checkpoint_save_blocking"]
    started = {e.span for e in marks if isinstance(e, PhaseStarted)}
    return bool(started - {e.span for e in marks if isinstance(e, PhaseEnded)})


def _trains_after_saves(events: list[Any]) -> bool:
    """No save open, and a progress span since the latest one ended."""
    ends = [e.ts for e in events if isinstance(e, PhaseEnded)
            and e.phase == "checkpoint_save_blocking"]
    return (not _saving(events) and bool(ends)
            and any(isinstance(e, Progress) and e.ts > max(ends) for e in events))


@contextmanager
def _frozen(af: EmbeddedAirflow, job: str) -> Iterator[None]:
    """The job's trainer stopped (SIGSTOP, with its children) for the block: what the
    controller looks at stays as it was however long the controller takes (it imports
    Airflow: 10 s and more on a loaded machine, longer than any window a job's timing
    could hold open)."""
    trainers = []
    for pid in af.process_tree():
        try:
            process = psutil.Process(pid)
            if ("airflow_ett.trainer" in process.cmdline()
                    and process.environ().get("ETT_JOB_ID") == job):
                trainers += [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
    assert trainers, f"no trainer process of {job}"
    for process in trainers:
        process.suspend()
    try:
        yield
    finally:
        for process in trainers:
            process.resume()


def _controller(af: EmbeddedAirflow) -> str:
    done = subprocess.run([str(venv_script("airflow-ett")), "preemption", "run", "--once"],
                          env=af.env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _a_tenant_at_its_guarantee_is_not_touched(af: EmbeddedAirflow, url: str,
                                              tmp: Path) -> None:
    """The same two jobs, but the GPU is now batch's guarantee: no preemption."""
    from airflow_ett.operators.job import job_paths

    text = TENANTS.replace("quota_gpus = 0\nborrow_limit_gpus = 1", "quota_gpus = 1")
    (tmp / "tenants.toml").write_text(text, encoding="utf-8")  # read again on its next look
    low_run = af.trigger("pre_low")
    low = job_id_for("pre_low", low_run)
    _wait("the low job trains again",
          lambda: any(isinstance(e, Progress) for e in _events(url, low)), af)
    high_run = af.trigger("pre_high")
    _wait("the high job waits again", lambda: _ti(af, "pre_high", high_run)[
        "state"] in ("scheduled", "queued"), af)
    said = _controller(af)
    assert "not eligible: 1 of a tenant at or below its guarantee" in said, said
    assert "asked" not in said
    job_dir = job_paths(tmp / "home" / "ett_work", "pre_low", low_run).job_dir
    assert not list(job_dir.glob("preempt_request*"))


def _start(af: EmbeddedAirflow) -> None:
    migrate(af)
    synced = af.ett("tenants", "sync")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    af.start(WITHOUT_TRIGGERER)
    af.wait_until_ready(180.0)
    for dag_id in ("pre_low", "pre_high"):
        af.wait_for_dag(dag_id, timeout=120.0)
        af.unpause(dag_id)


def _preempt_once(af: EmbeddedAirflow, url: str) -> tuple[str, str]:
    """Low runs; high arrives; not while low starts; then low yields. Both finish."""
    low_run = af.trigger("pre_low")
    low = job_id_for("pre_low", low_run)
    _wait("the low job's attempt starts",
          lambda: any(isinstance(e, AttemptStarted) for e in _events(url, low)), af)
    with _frozen(af, low):  # in startup (its data pipeline still starting) meanwhile
        assert "0 waiting" in _controller(af)  # nobody waits: nothing to decide
        high_run = af.trigger("pre_high")
        _wait("the high job waits for the slot", lambda: _ti(af, "pre_high", high_run)[
            "state"] in ("scheduled", "queued"), af)
        # In startup, the low job is not a victim.
        assert not any(isinstance(e, Progress) for e in _events(url, low))
        in_startup = _controller(af)
        assert "not eligible: 1 in startup" in in_startup and "asked" not in in_startup
    _wait("the low job trains",
          lambda: any(isinstance(e, Progress) for e in _events(url, low)), af)
    _wait("two periodic saves of the low job (its cadence)",
          lambda: sum(isinstance(e, CheckpointSaved) for e in _events(url, low)) >= 2, af,
          timeout=120.0)
    # Mid-save (its slow third save), the low job is not a victim either.
    _wait("the low job's slow save begins", lambda: _saving(_events(url, low)), af,
          timeout=60.0)
    with _frozen(af, low):
        mid_save = _controller(af)
        assert _saving(_events(url, low))
    assert "not eligible: 1 saving a checkpoint" in mid_save and "asked" not in mid_save, \
        mid_save
    # Once that save has ended and the trainer has said so, the controller asks; stopped
    # meanwhile, the job cannot reach its last step first (on a loaded machine each look
    # takes 10-20 s, and a job that finishes has nothing left to yield).
    _wait("the slow save ends and the low job trains on",
          lambda: _trains_after_saves(_events(url, low)), af, timeout=60.0)
    with _frozen(af, low):
        said = _wait("the controller asks the low job to yield",
                     lambda: (out := _controller(af)) and "asked to yield" in out and out, af,
                     timeout=60.0)
    assert f"preempted {low}: tenant batch over its guarantee by 1 GPU" in said
    assert "yields at its next checkpoint" in said, said
    assert af.wait_for_run("pre_high", high_run, timeout=420.0) == "success"
    assert af.wait_for_run("pre_low", low_run, timeout=600.0) == "success"
    return low_run, high_run


def _the_low_job_lost_nothing(url: str, low_run: str, high_run: str, tmp: Path) -> None:
    from airflow_ett.operators.job import job_paths
    from airflow_ett.trainer.config import load_config
    from airflow_ett.trainer.final_state import load_final_state

    low, high = job_id_for("pre_low", low_run), job_id_for("pre_high", high_run)
    events = _events(url, low)
    preempted = [e for e in events if isinstance(e, AttemptEnded) and e.cause == "preemption"]
    assert len(preempted) == 1 and "tenant batch over its guarantee" in str(preempted[0].message)
    assert str(preempted[0].message).startswith("left at its checkpoint on request: ")
    # It left right after a periodic save: every save of that attempt is a periodic one
    # (no exit save), and it trained nothing past the last.
    gone = preempted[0].attempt
    saves = sorted(e.step for e in events if isinstance(e, CheckpointSaved) and e.attempt == gone)
    assert saves == list(range(30, 30 * len(saves) + 1, 30)) and len(saves) >= 3, saves
    assert max(e.step_end for e in events if isinstance(e, Progress)
               and e.attempt == gone) == saves[-1]
    # The high job ran while the low one waited: it started after the low one yielded.
    high_started = min(e.ts for e in _events(url, high) if isinstance(e, AttemptStarted))
    assert high_started >= preempted[0].ts
    assert [e.status for e in events if isinstance(e, JobEnded)] == ["success"]
    with EttStore(url) as store:
        summary = store.summary(low)
    assert summary["nof"]["preemption"] == 1 and summary["nof"]["total"] == 1
    assert len(summary["ttr_s"]) == 1 and summary["ttr_s"][0] > 0
    # No lost samples: the final weights are those of the job trained without preemption.
    job_dir = job_paths(tmp / "home" / "ett_work", "pre_low", low_run).job_dir
    (request,) = job_dir.glob("preempt_request.*.done.json")
    assert json.loads(request.read_text())["mode"] == "at_checkpoint"
    got = load_final_state(load_config(job_dir / "trainer.json"))
    assert_same_weights(reference_weights(job_dir, tmp), got, "after the preemption")


def test_a_high_priority_job_preempts_a_borrower_that_resumes_losing_nothing(
        tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "jobs.py").write_text(DAGS, encoding="utf-8")
    (tmp_path / "tenants.toml").write_text(TENANTS, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    env = {"AIRFLOW__ETT__TENANTS_FILE": str(tmp_path / "tenants.toml"),
           "AIRFLOW__ETT__STORE_URL": url}
    with EmbeddedAirflow(tmp_path / "home", dags, parallelism=1, extra_env=env) as af:
        _start(af)
        low_run, high_run = _preempt_once(af, url)
        low_ti, high_ti = _ti(af, "pre_low", low_run), _ti(af, "pre_high", high_run)
        _a_tenant_at_its_guarantee_is_not_touched(af, url, tmp_path)
    # The cluster policy put each train task in its tenant's pool; no retry was spent.
    assert (low_ti["pool"], high_ti["pool"]) == ("ett_tenant_batch", "ett_tenant_ads")
    assert low_ti["try_number"] == 1
    _the_low_job_lost_nothing(url, low_run, high_run, tmp_path)
