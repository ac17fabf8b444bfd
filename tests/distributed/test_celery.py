"""The lifecycle on a distributed Airflow: CeleryExecutor, PostgreSQL (Airflow's metadata
and the ETT store, each a throwaway database), Redis as the broker, and the services of
docker/compose.yaml as processes (tests/distributed/cluster.py), with a `gpu` and a `cpu`
Celery worker.

- Routing: prewarm and publish run on the cpu worker, train on the gpu worker (the task
  instances' queues and the workers' own logs say so); the events land in PostgreSQL.
- A lost worker: the gpu worker's whole process tree is SIGKILLed mid-training (a host
  gone). The scheduler notices the missing heartbeats and fails the try from outside, a
  restarted worker runs the retry, which restores the newest checkpoint; the run
  finishes with one `infra` failure whose recovery is broken down, and with the weights
  of the same job trained without the fault.
- Load: 4 lifecycle runs submitted at once (two per GPU slot); all finish, no event lost
  or doubled (each trainer attempt's own count of what it sent against what the store
  holds of it), and every run's components sum to its E2E.

There is no GPU here: the `gpu` queue's worker runs the trainer on CPU, which is all the
routing and recovery paths need.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.ett.events import AttemptEnded, CheckpointSaved, Progress, TaskStateChanged
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore
from tests.airflow_db import migrate
from tests.distributed.cluster import (
    CeleryAirflow,
    Services,
    throwaway_databases,
    throwaway_redis_db,
)
from tests.reference_run import assert_same_weights, reference_weights

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.slow,
              pytest.mark.timeout(1500)]

TINY = {"num_workers": 0, "batch_size": 64, "log_every_s": 1.0, "seed": 11}
#: Runs submitted at once: twice the two GPU slots, so half wait queued in the broker
#: (bench/distributed_load.py submits 20 for its throughput figure).
LOAD_RUNS = 4
DAGS = f'''# lifecycle DAGs for the distributed tier (parsed only if it says "airflow" and "DAG")
from datetime import timedelta

from airflow_ett.operators import training_job

TINY = {TINY!r}
# the whole lifecycle: prewarm (cpu) >> train (gpu) >> publish (cpu)
lifecycle = training_job("dist_lifecycle", model="dlrm_tiny", tenant="t", steps=30,
                         checkpoint_interval=10, trainer_options=TINY)
# long enough to be killed mid-training; a checkpoint every 60 steps (about 4 s)
lost = training_job("dist_lost_worker", model="dlrm_tiny", tenant="t", steps=240,
                    checkpoint_interval=60, restarts=0, retries=2,
                    retry_delay=timedelta(seconds=1), optimizations={{"compile_cache": False}},
                    trainer_options={{**TINY, "compile": False, "step_sleep_s": 0.05}})
# the load: train (gpu) >> publish (cpu), many at once
load = training_job("dist_load", model="dlrm_tiny", tenant="t", steps=20,
                    checkpoint_interval=10,
                    optimizations={{"compile_cache": False, "warm_standby": False}},
                    trainer_options={{**TINY, "compile": False}})
'''
# A lost worker is noticed after this many seconds without a task heartbeat (Airflow's
# default is 300: a test waits for a fraction of it, production keeps its own).
HEARTBEAT_TIMEOUT_S = 20
#: How often a task's supervisor heartbeats (Airflow's `[workers] min_heartbeat_interval`).
HEARTBEAT_EVERY_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryAirflow]:
    root = tmp_path_factory.mktemp("celery")
    dags = root / "dags"
    dags.mkdir()
    (dags / "ett_distributed_dags.py").write_text(textwrap.dedent(DAGS))
    host_tmp = root / "tmp"  # no warm inductor cache from elsewhere
    host_tmp.mkdir()
    overrides = {
        "TMPDIR": str(host_tmp),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    }
    with throwaway_databases("airflow", "ett") as dbs, throwaway_redis_db() as redis_db, \
            CeleryAirflow(root / "home", dags, Services(dbs["airflow"], dbs["ett"], redis_db),
                          overrides, scale={"worker-gpu": 2}) as af:
        migrate(af)
        af.start_all(workers=["worker-gpu", "worker-cpu"])  # the second gpu host: later
        af.wait_until_ready(240.0)
        af.wait_for_workers(timeout=180.0)
        yield af


def _trigger(af: CeleryAirflow, dag_id: str) -> str:
    af.wait_for_dag(dag_id, timeout=120.0)
    af.unpause(dag_id)
    return af.trigger(dag_id)


def _events(af: CeleryAirflow, job: str) -> list[Any]:
    with EttStore(af.ett_url) as store:
        return store.job_events(job)


def test_the_lifecycle_runs_each_task_on_its_queue_and_records_in_postgres(
        cluster: CeleryAirflow) -> None:
    af = cluster
    run_id = _trigger(af, "dist_lifecycle")
    assert af.wait_for_run("dist_lifecycle", run_id, timeout=600.0) == "success", (
        af.task_instances("dist_lifecycle", run_id), af.log_tail("scheduler"))
    tis = {t["task_id"]: t for t in af.task_instances("dist_lifecycle", run_id)}
    assert {k: t["queue"] for k, t in tis.items()} == {
        "prewarm_compile_cache": "cpu", "train": "gpu", "publish_model": "cpu"}
    assert {k: af.workload_ran_on("dist_lifecycle", run_id, k) for k in tis} == {
        "prewarm_compile_cache": ["worker-cpu"], "train": ["worker-gpu"],
        "publish_model": ["worker-cpu"]}
    job = job_id_for("dist_lifecycle", run_id)
    with EttStore(af.ett_url) as store:
        assert store.url.startswith("postgresql")
        summary = store.summary(job)
    assert not summary["provisional"] and summary["started"]
    assert summary["nof"]["total"] == 0 and summary["effective_s"] > 0
    assert [a["status"] for a in summary["attempts"]] == ["success"]


def test_a_lost_gpu_worker_is_detected_and_its_retry_restores_the_newest_checkpoint(
        cluster: CeleryAirflow, tmp_path: Path) -> None:
    from airflow_ett.operators.job import job_paths
    from airflow_ett.trainer.config import load_config
    from airflow_ett.trainer.final_state import load_final_state

    af = cluster
    run_id = _trigger(af, "dist_lost_worker")
    job = job_id_for("dist_lost_worker", run_id)

    def mid_training() -> bool:  # two checkpoints saved, and steps reported since the last
        events = _events(af, job)
        saved = [e.step for e in events if isinstance(e, CheckpointSaved)]
        return len(saved) >= 2 and any(isinstance(e, Progress) and e.step_end > max(saved)
                                       for e in events)
    # the kill lands between two saves (the next is seconds away), so the retry has work
    # to replay and the newest save's event has been delivered
    af.wait_until("two checkpoints of the first attempt", mid_training, poll=0.25)
    killed = af.kill("worker-gpu")
    killed_at = time.time()
    assert len(killed) >= 3, killed  # the worker, its task's supervisor and runner, the trainer
    time.sleep(2.0)
    af.start_worker("worker-gpu")  # a replacement host comes up
    af.wait_for_workers(["worker-gpu"])
    assert af.wait_for_run("dist_lost_worker", run_id, timeout=600.0) == "success", (
        af.task_instances("dist_lost_worker", run_id), af.log_tail("scheduler"))

    (train,) = [t for t in af.task_instances("dist_lost_worker", run_id)
                if t["task_id"] == "train"]
    assert train["try_number"] == 2
    # the retry ran on the restarted worker: its log since the restart shows the workload
    since_restart = af.log_tail("worker-gpu", 2000)
    assert "Executing workload" in since_restart and f"run_id='{run_id}'" in since_restart
    events = _events(af, job)
    ended = [e for e in events if isinstance(e, AttemptEnded) and e.status == "failed"]
    assert len(ended) == 1, ended
    lost = ended[0]
    assert lost.cause == "infra" and "failed by the scheduler" in str(lost.message)
    # the try was failed from outside: by the scheduler, not by the task itself
    tries = {(e.try_number, e.state, e.source) for e in events
             if isinstance(e, TaskStateChanged) and e.task_id == "train"}
    assert (1, "up_for_retry", "scheduler") in tries, tries
    assert not any(t[0] == 1 and t[2] == "worker" and t[1] != "running" for t in tries), tries
    # detected by the heartbeat check: the try's last heartbeat (at most one interval
    # before the kill) plus the timeout
    assert lost.detected_ts is not None
    noticed_after = lost.detected_ts - killed_at
    assert noticed_after >= HEARTBEAT_TIMEOUT_S - HEARTBEAT_EVERY_S, noticed_after
    # the retry restored the newest committed checkpoint of the lost attempt: it
    # trained on from there, not from the start. At least the newest one reported: a save
    # that committed in the instant before the kill can have its event die with the
    # worker (the emitter delivers in the background), and the restore then finds it.
    saves = [e.step for e in events if isinstance(e, CheckpointSaved)
             and e.attempt == lost.attempt]
    resumed = min(e.step_start for e in events if isinstance(e, Progress)
                  and e.attempt != lost.attempt)
    assert resumed >= max(saves) > 0 and resumed % 60 == 0, (resumed, saves)
    with EttStore(af.ett_url) as store:
        summary = store.summary(job)
    assert summary["nof"]["total"] == 1 and summary["nof"]["infra"] == 1
    (failure,) = summary["failures"]
    stages = failure["stages"]
    for stage in ("detection", "rescheduling", "startup", "restore", "replay"):
        assert stages.get(stage, 0.0) > 0.0, (stage, stages)
    assert stages["detection"] >= HEARTBEAT_TIMEOUT_S - HEARTBEAT_EVERY_S, stages
    job_dir = job_paths(af.work_dir, "dist_lost_worker", run_id).job_dir
    assert_same_weights(reference_weights(job_dir, tmp_path),
                        load_final_state(load_config(job_dir / "trainer.json")),
                        "after the lost worker")


_SENT = re.compile(r"ETT events sent by attempt (\S+) rank (\d+): (\{.*\})")


def _reported_deliveries(task_log: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(attempt, rank) -> what that trainer process said it sent (`Emitter.delivery`),
    from the train task's log: JSON lines (Airflow 3), the trainer's own line in each
    one's `event`."""
    import json

    found = {}
    for line in task_log.read_text(encoding="utf-8").splitlines():
        try:
            text = str(json.loads(line).get("event", ""))
        except (ValueError, AttributeError):
            text = line
        match = _SENT.search(text)
        if match:
            found[(match.group(1), match.group(2))] = json.loads(match.group(3))
    return found


def test_many_runs_at_once_all_finish_with_every_event_recorded_once(
        cluster: CeleryAirflow) -> None:
    af = cluster
    af.start_worker("worker-gpu-2")  # `--scale worker-gpu=2`: a second GPU host joins
    af.wait_for_workers(["worker-gpu-2"])
    af.wait_for_dag("dist_load", timeout=120.0)
    af.unpause("dist_load")
    began = time.monotonic()
    runs = [af.trigger("dist_load") for _ in range(LOAD_RUNS)]
    states = {r: af.wait_for_run("dist_load", r, timeout=900.0) for r in runs}
    elapsed = time.monotonic() - began
    print(f"\n{LOAD_RUNS} lifecycle runs (train + publish, tiny model) on 3 Celery workers "
          "(2 gpu with 1 slot each, 1 cpu with 2): "
          f"{elapsed:.0f} s trigger to last end, {LOAD_RUNS * 3600 / elapsed:.0f} runs/h "
          f"({datetime.now().isoformat(timespec='minutes')})")
    assert set(states.values()) == {"success"}, states
    workers: dict[str, set[str]] = {"train": set(), "publish_model": set()}
    with EttStore(af.ett_url) as store:
        for run_id in runs:
            for task in workers:
                workers[task].update(af.workload_ran_on("dist_load", run_id, task))
            job = job_id_for("dist_load", run_id)
            events = store.job_events(job)
            ids = [e.id for e in events]
            assert len(ids) == len(set(ids))
            # what each trainer attempt says it sent, against what the store holds of it
            sent = _reported_deliveries(af.task_log_path("dist_load", run_id, "train", 1))
            assert sent, f"no trainer reported its events in {run_id}'s train log"
            for attempt, counts in sent.items():
                held = [e for e in events if e.id.startswith(counts["id_prefix"])]
                assert len(held) == counts["sent"], (run_id, attempt, counts, len(held))
                assert counts["lost"] == 0, (run_id, attempt, counts)
            summary = store.summary(job)
            assert not summary["provisional"] and summary["nof"]["total"] == 0
            parts = sum(summary["components"].values())
            assert abs(parts - summary["e2e_s"]) <= 1e-3 * max(1.0, summary["e2e_s"]), (
                run_id, summary["components"], summary["e2e_s"])
    assert workers == {"train": {"worker-gpu", "worker-gpu-2"},
                       "publish_model": {"worker-cpu"}}, workers
