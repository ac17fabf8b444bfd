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
from tests.hostile import HOSTILE_JSON, in_thread


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
    assert set(dag.tags) == {"ett", "ett:tenant=ads", "ett:model=dlrm_tiny", "ett:gpus=1"}
    assert set(dag.params) == {"steps", "inject_fault", "fault_at_step", "fault_attempt"}
    # a preemption retries at once; anything else waits the retry delay
    decision = train.retry_policy.evaluate(TrainerPreempted("x"), 1, 3)
    assert decision.retry_delay == timedelta(0)


def test_the_dag_and_its_tasks_carry_their_documentation() -> None:
    dag = build(tenant="ads", steps=40)
    assert "Training job `dlrm_tiny` (tenant `ads`)" in dag.doc_md
    for param in ("`steps` (default 40)", "`inject_fault`", "`fault_at_step`",
                  "`fault_attempt`"):
        assert param in dag.doc_md
    for task_id in ("prewarm_compile_cache", "train", "publish_model"):
        doc = dag.get_task(task_id).doc_md
        assert doc and f"`{task_id}` | {doc} |" in dag.doc_md
    assert build(doc_md="mine").doc_md == "mine"  # an owner's own documentation wins
    assert "recording is off" in build(record=False).doc_md


def test_optimizations_off_is_the_baseline_shape() -> None:
    dag = build(optimizations={"compile_cache": False, "standalone_publish": False,
                               "async_checkpoint": False})
    assert [t.task_id for t in dag.tasks] == ["train"]
    train = dag.get_task("train")
    assert train.publish_in_task
    opts = train.trainer_config["optimizations"]
    assert opts == {"fast_batch": True, "parallel_init": True, "compile_cache": False,
                    "async_checkpoint": False, "warm_standby": True}


def test_record_false_drops_the_ett_tag_and_recording() -> None:
    dag = build(record=False)
    assert "ett" not in dag.tags
    assert dag.get_task("train").child_env() == {"AIRFLOW__ETT__DISABLED": "True"}


def test_trigger_form_defaults_come_from_the_first_fault() -> None:
    dag = build(faults=[{"kind": "kill", "at_step": 12, "attempt": 1}])
    params = dag.params.dump()
    assert (params["inject_fault"], params["fault_at_step"], params["fault_attempt"]) == (
        "kill", 12, 1)


def test_the_trigger_form_bounds_its_numbers_as_the_trainer_does() -> None:
    """The form refuses what the trainer would (the same bounds), before a run starts."""
    from airflow.sdk.definitions.param import ParamValidationError

    dag = build()
    bounds = {name: (dag.params.get_param(name).schema.get("minimum"),
                     dag.params.get_param(name).schema.get("maximum"))
              for name in ("steps", "fault_at_step", "fault_attempt")}
    assert bounds == {"steps": (1, 10**9), "fault_at_step": (1, 10**9),
                      "fault_attempt": (1, 10_000)}
    with pytest.raises(ParamValidationError):
        dag.params.get_param("steps").resolve(10**9 + 1)


def test_model_from_a_json_file_is_read_at_parse_time(tmp_path: Path) -> None:
    from airflow_ett.trainer.model_config import BUNDLED

    path = tmp_path / "my_model.json"
    path.write_text(json.dumps({**BUNDLED["dlrm_tiny"].to_dict(), "name": "mine"}))
    dag = build(model=str(path))
    assert dag.get_task("train").trainer_config["model"]["name"] == "mine"
    assert "ett:model=my_model" in dag.tags


@pytest.mark.parametrize(("kind", "make"), HOSTILE_JSON)
def test_a_hostile_model_file_is_one_line_at_parse_time(tmp_path: Path, kind: str,
                                                        make: Any) -> None:
    """Read in the DAG processor: a FIFO or /dev/zero would hang it, 200 MB exhaust it,
    5,000 levels raise RecursionError. Each is the `JobConfigError` naming the option."""
    path = tmp_path / "model.json"
    says = make(path)
    with pytest.raises(JobConfigError) as info:
        in_thread(lambda: build(model=str(path)))
    assert f"model = '{path}': cannot read a JSON model config there: {says}" in str(
        info.value)


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
    # issue 22: every number in a plausible range, the bound named
    ({"steps": 10**9 + 1}, "steps = 1000000001: must be >= 1 and <= 1000000000"),
    ({"retries": 101}, "retries = 101: must be >= 0 and <= 100"),
    ({"restarts": 101}, "restarts = 101: must be >= 0 and <= 100"),
    ({"nproc": 1025}, "nproc = 1025: must be >= 1 and <= 1024"),
    ({"retry_delay": timedelta(days=2)},
     "retry_delay = datetime.timedelta\\(days=2\\): must be a timedelta >= 0 and <= 86400 s"),
    ({"trainer_options": {"step_sleep_s": 1e308}}, "step_sleep_s = 1e\\+308: must be >= 0"),
    ({"trainer_options": {"num_workers": 100_000}}, "num_workers = 100000: must be >= 0 and "
                                                     "<= 256"),
    ({"faults": [{"kind": "kill", "at_step": 21}]},
     "faults\\[0\\].at_step = 21: must be at most steps \\(20\\)"),
])
def test_bad_options_fail_at_parse_time_naming_field_and_value(
        changes: dict[str, Any], message: str) -> None:
    with pytest.raises(JobConfigError, match=message):
        build(**changes)


HUGE = {"name": "huge", "num_dense": 8, "embedding_dim": 8, "tables": [["cat_0", 10**12]],
        "dense_arch": [8], "over_arch": [1]}


@pytest.mark.parametrize(("changes", "message"), [
    # issue 8: booleans are booleans, integers integers, mappings mappings
    ({"trainer_options": {"compile": "no"}}, "compile = 'no': must be true or false"),
    ({"record": "no"}, "record = 'no': must be true or false"),
    ({"tags": "abc"}, "tags = 'abc': must be a list"),
    ({"tags": ["a", 1]}, "tags\\[1\\] = 1: must be a string"),
    ({"queues": ["gpu"]}, "queues = \\['gpu'\\]: must be a mapping"),
    ({"pools": "gpus"}, "pools = 'gpus': must be a mapping"),
    ({"faults": "kill"}, "faults = 'kill': must be a list"),
    ({"faults": ["kill"]}, "faults\\[0\\] = 'kill': must be a mapping"),
    ({"faults": [{"kind": "kill", "at_step": 8.9}]}, "faults\\[0\\].at_step = 8.9"),
    ({"optimizations": "all"}, "optimizations = 'all': must be a mapping"),
    ({"trainer_options": ["batch_size"]}, "trainer_options = \\['batch_size'\\]: must be a"),
    ({"trainer_options": {"grace_s": float("inf")}}, "grace_s = inf: must be a finite"),
    ({"trainer_options": {"log_every_s": float("nan")}}, "log_every_s = nan: must be a fin"),
    ({"trainer_options": {"num_workers": 1.5}}, "num_workers = 1.5: must be an integer"),
    ({"model": {**HUGE, "num_dense": 8.9}}, "num_dense = 8.9: must be an integer"),
    ({"model": 7}, "model = 7: must be a bundled model"),
    ({"steps": 20.0}, "steps = 20.0: must be an integer"),
    ({"steps": True}, "steps = True: must be an integer"),
    ({"nproc": True}, "nproc = True: must be an integer"),
    ({"restarts": 1.5}, "restarts = 1.5: must be an integer"),
    ({"tenant": 5}, "tenant = 5: must be a string"),
    ({"start_date": "2026-01-01"}, "start_date = '2026-01-01': must be a datetime"),
    ({"work_dir": 3}, "work_dir = 3: must be a path"),
    # issue 7 at parse time: sizes that cannot fit anywhere, by pure arithmetic
    ({"model": HUGE}, "model.tables\\[cat_0\\] = 1000000000000: the model needs an "
                      "estimated 96.0 TB"),
    ({"trainer_options": {"batch_size": 10**10, "compile": False}},
     "batch_size = 10000000000: must be >= 1 and <= 1048576"),
    ({"model": {**HUGE, "tables": [[f"t{i}", 1000] for i in range(64)],
                "ids_per_feature": 65536},  # 33.6 MB per example: > the 1 TiB cap
      "trainer_options": {"batch_size": 65536, "compile": False}},
     "batch_size = 65536: batches need an estimated"),
    ({"trainer_options": {"lr_dense": float("nan")}}, "lr_dense = nan"),
])
def test_no_silent_coercion_and_impossible_sizes_fail_at_parse_time(
        changes: dict[str, Any], message: str) -> None:
    with pytest.raises(JobConfigError, match=message) as info:
        build(**changes)
    assert "\n" not in str(info.value)


def test_a_work_dir_that_is_a_file_fails_at_parse_time(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(JobConfigError, match=r"work_dir = '.*f': exists and is not a direc"):
        build(work_dir=str(tmp_path / "f"))


def test_huge_tables_fit_when_sharded_over_enough_processes() -> None:
    model = {**HUGE, "tables": [["cat_0", 4 * 10**10]]}  # 3.8 TB in one process
    with pytest.raises(JobConfigError, match=r"model.tables"):
        build(model=model)
    assert build(model=model, nproc=8).get_task("train").nproc == 8


def test_compile_false_has_no_prewarm_task() -> None:
    assert [t.task_id for t in build(trainer_options={"compile": False}).tasks] == [
        "train", "publish_model"]
