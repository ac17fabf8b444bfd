"""The demo lifecycle DAG on a real Airflow: SQLite, LocalExecutor, and the scheduler,
dag-processor and API server as separate processes (not `dag.test()`, which
fires neither `on_starting` nor the DAG-run hooks).

The demo runs with a cold compile cache: its prewarm pays the model's one full compile,
its train task recovers one injected failure, and its model is published on CPU after
the GPU task ended. How it compares with the baseline DAG (compilation, checkpoint
blocking, shutdown, ETT%) is a speed figure, measured by `python -m bench.lifecycle_dags`
(bench/RESULTS.md), not asserted here: timed comparisons in a test fail on a busy
machine and prove nothing on a quiet one.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from airflow_ett.embedded import EmbeddedAirflow, RunResult
from airflow_ett.ett.events import JobEnded, JobSubmitted, ModelPublished, TaskStateChanged
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore
from tests.e2e.lifecycle.shared import dag_folder

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

DEMO_DAG = Path(__file__).resolve().parents[3] / "dags" / "ett_dlrm_demo.py"


@pytest.fixture(scope="module")
def airflow(shared_airflow: EmbeddedAirflow) -> EmbeddedAirflow:
    shutil.copy(DEMO_DAG, dag_folder(shared_airflow, "demo"))
    return shared_airflow


def run(af: EmbeddedAirflow, dag_id: str) -> RunResult:
    af.wait_for_dag(dag_id, timeout=120.0)
    af.unpause(dag_id)
    run_id = af.trigger(dag_id)
    state = af.wait_for_run(dag_id, run_id, timeout=600.0)
    return RunResult(dag_id, run_id, state, af.task_instances(dag_id, run_id), 0.0, {})


def store(af: EmbeddedAirflow) -> EttStore:
    return EttStore(f"sqlite:///{af.home}/ett.db")


@pytest.fixture(scope="module")
def demo(airflow: EmbeddedAirflow) -> tuple[RunResult, dict[str, Any], list[Any]]:
    result = run(airflow, "ett_dlrm_demo")
    assert result.succeeded, (result.task_instances, airflow.log_tail("scheduler"))
    job = job_id_for(result.dag_id, result.run_id)
    with store(airflow) as s:
        return result, s.summary(job), s.job_events(job)


def when(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def test_the_demo_recovers_one_failure_and_its_ett_adds_up(demo: Any) -> None:
    result, summary, events = demo
    assert [t["state"] for t in result.task_instances] == ["success"] * 3
    assert summary["nof"]["total"] == 1 and summary["nof"]["infra"] == 1
    assert not summary["provisional"]
    assert sum(summary["components"].values()) == pytest.approx(summary["e2e_s"], abs=1e-5)
    assert summary["phases"]["replay"] > 0
    assert summary["components"]["effective_training"] > 0
    assert summary["phases"]["cache_prewarm"] > 0  # the prewarm task is in the job
    # The listeners' part: submission from the scheduler, task tries from the workers.
    (submitted,) = [e for e in events if isinstance(e, JobSubmitted)]
    assert (submitted.tenant, submitted.model) == ("demo", "dlrm_small")
    tries = {(e.task_id, e.state) for e in events if isinstance(e, TaskStateChanged)}
    for task in ("prewarm_compile_cache", "train", "publish_model"):
        assert {(task, "running"), (task, "success")} <= tries


def test_the_model_is_published_after_the_gpu_task_ended(
        airflow: EmbeddedAirflow, demo: Any) -> None:
    from airflow_ett.trainer.publish import build_published_model, load_published

    result, summary, events = demo
    tis = {t["task_id"]: t for t in result.task_instances}
    assert when(tis["publish_model"]["start_date"]) >= when(tis["train"]["end_date"])
    (ended,) = [e for e in events if isinstance(e, JobEnded)]
    (published,) = [e for e in events if isinstance(e, ModelPublished)]
    assert published.ts > ended.ts
    assert summary["model_available_after_release_s"] > 0
    assert "publish_in_gpu" not in summary["phases"]

    path = Path(str(published.uri))
    tensors, manifest = load_published(path)
    assert manifest["checkpoint"]["step"] == 400  # the demo's steps: the final checkpoint
    assert manifest["ett_summary"]["nof"]["total"] == 1
    model = build_published_model(path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tensors.items())
