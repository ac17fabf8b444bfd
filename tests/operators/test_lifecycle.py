"""`training_job(...)`: the DAG it builds and the errors it gives at parse time."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.operators import (
    CompileCachePrewarmOperator,
    JobConfigError,
    PublishModelOperator,
    TorchRecTrainOperator,
    training_job,
)
from airflow_ett.operators.errors import TrainerPreempted


def build(**changes: Any) -> Any:
    kwargs: dict[str, Any] = {"model": "dlrm_tiny", "steps": 20,
                              "trainer_options": {"compile": True}}
    kwargs.update(changes)
    return training_job("job", **kwargs)


def test_lifecycle_is_prewarm_then_train_then_publish() -> None:
    dag = build(tenant="ads", retries=3, restarts=2, queues={"train": "a100"},
                pools={"train": "gpus"}, retry_delay=timedelta(seconds=7))
    prewarm, train, publish = (dag.get_task(t) for t in
                               ("prewarm_compile_cache", "train", "publish_model"))
    assert isinstance(prewarm, CompileCachePrewarmOperator)
    assert isinstance(train, TorchRecTrainOperator)
    assert isinstance(publish, PublishModelOperator)
    assert train.upstream_task_ids == {"prewarm_compile_cache"}
    assert publish.upstream_task_ids == {"train"}
    assert (prewarm.queue, train.queue, publish.queue) == ("cpu", "a100", "cpu")
    assert train.pool == "gpus" and train.retries == 3 and train.restarts == 2
    assert train.retry_delay == timedelta(seconds=7)
    assert not train.publish_in_task
    assert set(dag.tags) == {"ett", "ett:tenant=ads", "ett:model=dlrm_tiny"}
    assert set(dag.params) == {"steps", "inject_fault", "fault_at_step", "fault_attempt"}
    # a preemption retries at once; anything else waits the retry delay
    decision = train.retry_policy.evaluate(TrainerPreempted("x"), 1, 3)
    assert decision.retry_delay == timedelta(0)


def test_optimizations_off_is_the_baseline_shape() -> None:
    dag = build(optimizations={"compile_cache": False, "standalone_publish": False,
                               "async_checkpoint": False})
    assert [t.task_id for t in dag.tasks] == ["train"]
    train = dag.get_task("train")
    assert train.publish_in_task
    opts = train.trainer_config["optimizations"]
    assert opts == {"fast_batch": True, "parallel_init": True, "compile_cache": False,
                    "async_checkpoint": False}


def test_record_false_drops_the_ett_tag_and_recording() -> None:
    dag = build(record=False)
    assert "ett" not in dag.tags
    assert dag.get_task("train").child_env() == {"AIRFLOW__ETT__DISABLED": "True"}


def test_trigger_form_defaults_come_from_the_first_fault() -> None:
    dag = build(faults=[{"kind": "kill", "at_step": 12, "attempt": 1}])
    params = dag.params.dump()
    assert (params["inject_fault"], params["fault_at_step"], params["fault_attempt"]) == (
        "kill", 12, 1)


def test_model_from_a_json_file_is_read_at_parse_time(tmp_path: Path) -> None:
    from airflow_ett.trainer.model_config import BUNDLED

    path = tmp_path / "my_model.json"
    path.write_text(json.dumps({**BUNDLED["dlrm_tiny"].to_dict(), "name": "mine"}))
    dag = build(model=str(path))
    assert dag.get_task("train").trainer_config["model"]["name"] == "mine"
    assert "ett:model=my_model" in dag.tags


@pytest.mark.parametrize(("changes", "message"), [
    ({"steps": 0}, "steps = 0"),
    ({"retries": -1}, "retries = -1"),
    ({"restarts": -1}, "restarts = -1"),
    ({"nproc": 0}, "nproc = 0"),
    ({"optimizations": {"turbo": True}}, "optimizations\\['turbo'\\]: unknown"),
    ({"optimizations": {"fast_batch": "yes"}}, "optimizations\\['fast_batch'\\] = 'yes'"),
    ({"queues": {"trainer": "gpu"}}, "queues has unknown key\\(s\\) \\['trainer'\\]"),
    ({"pools": {"train": ""}}, "pools\\['train'\\] = ''"),
    ({"checkpoint_interval": 0}, "checkpoint_interval = 0"),
    ({"faults": [{"kind": "melt", "at_step": 1}]}, "faults\\[0\\].kind = 'melt'"),
    ({"trainer_options": {"steps": 5}}, "trainer_options \\['steps'\\]"),
    ({"trainer_options": {"checkpoint_dir": "/x"}}, "checkpoint_dir"),
    ({"model": "dlrm_huge"}, "model = 'dlrm_huge'"),
    ({"model": "/no/such/model.json"}, "model = '/no/such/model.json'"),
    ({"tenant": ""}, "tenant = ''"),
    ({"retry_delay": 5}, "retry_delay = 5"),
])
def test_bad_options_fail_at_parse_time_naming_field_and_value(
        changes: dict[str, Any], message: str) -> None:
    with pytest.raises(JobConfigError, match=message):
        build(**changes)
