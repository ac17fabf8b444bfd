"""`PublishModelOperator.execute` after a real (short) training run, and the baseline's
publish inside the train task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ett.ett.events import JobEnded, ModelPublished, PhaseStarted
from airflow_ett.operators import PublishModelOperator, TorchRecTrainOperator
from airflow_ett.trainer.publish import load_published
from tests.operators.conftest import TINY, context, store_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_publish_after_the_train_task_writes_a_version_with_the_runs_ett(
        ett_home: Path) -> None:
    TorchRecTrainOperator(task_id="train", trainer_config=TINY).execute(context("pub"))
    out = PublishModelOperator(task_id="publish", trainer_config=TINY).execute(context("pub"))
    tensors, manifest = load_published(Path(out["path"]))
    assert out["version"] == 1 and tensors
    assert manifest["checkpoint"]["step"] == TINY["steps"]
    assert manifest["extra"] == {"job": "ett_test__pub", "dag_id": "ett_test", "run_id": "pub"}
    summary = manifest["ett_summary"]
    assert summary["provisional"] is False and summary["e2e_s"] > 0  # the job had ended
    assert manifest["metrics"]["ett_pct"] == pytest.approx(summary["ett_pct"])
    events = store_events("ett_test__pub")
    (ended,) = [e for e in events if isinstance(e, JobEnded)]
    (published,) = [e for e in events if isinstance(e, ModelPublished)]
    assert published.uri == out["path"] and published.ts > ended.ts
    json.loads((Path(out["path"]) / "manifest.json").read_text())  # a plain JSON file


def test_publish_in_task_holds_the_gpus_and_counts_as_shutdown(ett_home: Path) -> None:
    result = TorchRecTrainOperator(task_id="train", trainer_config=TINY,
                                   publish_in_task=True).execute(context("inside"))
    assert result["published"]["version"] == 1
    events = store_events("ett_test__inside")
    (ended,) = [e for e in events if isinstance(e, JobEnded)]
    (published,) = [e for e in events if isinstance(e, ModelPublished)]
    assert published.ts <= ended.ts  # available before the GPUs were released
    assert [e.phase for e in events if isinstance(e, PhaseStarted)
            and e.phase == "publish_in_gpu"] == ["publish_in_gpu"]


def test_publish_without_a_checkpoint_names_the_directory(ett_home: Path) -> None:
    from airflow_ett.trainer.publish import NoCheckpointError

    with pytest.raises(NoCheckpointError, match="checkpoints"):
        PublishModelOperator(task_id="publish", trainer_config=TINY).execute(context("none"))
