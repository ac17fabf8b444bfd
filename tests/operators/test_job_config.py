"""The lifecycle job's config and files (pure: no Airflow run, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ett.operators.job import (
    MANAGED_FIELDS,
    JobConfigError,
    TrainerFile,
    TrainerOptions,
    TrainerSpec,
    apply_params,
    check_train_args,
    check_trainer_config,
    job_paths,
    materialize,
)
from tests.operators.conftest import TINY


def test_job_paths_are_per_run_and_filesystem_safe(tmp_path: Path) -> None:
    a = job_paths(tmp_path, "dag", "manual__2026-11-29T10:00:00+00:00")
    b = job_paths(tmp_path, "dag", "manual__2026-11-29T10:00:00_00:00")
    assert a.job_dir != b.job_dir  # ids that differ only in unsafe characters stay apart
    assert ":" not in str(a.job_dir) and "+" not in str(a.job_dir)
    assert a.checkpoint_dir.parent == a.job_dir
    assert a.compile_cache_dir == b.compile_cache_dir == tmp_path / "compile_cache"


def test_params_override_steps_and_faults() -> None:
    base = {**TINY, "faults": [{"kind": "raise", "at_step": 3}]}
    assert apply_params(base, {"steps": "12"})["steps"] == 12
    assert apply_params(base, {"inject_fault": "none"})["faults"] == []
    assert apply_params(base, {"inject_fault": "kill", "fault_at_step": 5})["faults"] == [
        {"kind": "kill", "at_step": 5, "attempt": 1}]
    assert apply_params(base, {"unrelated": 1}) == base


def test_the_form_submitted_unchanged_keeps_every_configured_fault() -> None:
    """The form's defaults show the first fault only; submitting them unchanged (every
    triggered run does) must not drop the second (a job with two injected failures)."""
    two = {**TINY, "faults": [{"kind": "raise", "at_step": 30, "attempt": 1},
                              {"kind": "kill", "at_step": 70, "attempt": 2}]}
    form = {"steps": 100, "inject_fault": "raise", "fault_at_step": 30, "fault_attempt": 1}
    assert apply_params(two, form)["faults"] == two["faults"]
    changed = apply_params(two, {**form, "fault_at_step": 31})["faults"]
    assert changed == [{"kind": "raise", "at_step": 31, "attempt": 1}]
    assert apply_params({**TINY, "faults": []}, {"inject_fault": "none"})["faults"] == []


@pytest.mark.parametrize(("params", "named"), [
    ({"steps": 0}, "'steps' = 0"),
    ({"steps": "many"}, "'steps' = 'many'"),
    ({"inject_fault": "explode"}, "'inject_fault' = 'explode'"),
    ({"inject_fault": "kill", "fault_at_step": -2}, "'fault_at_step' = -2"),
    ({"inject_fault": "kill", "fault_attempt": True}, "'fault_attempt' = True"),
])
def test_bad_params_name_the_param_and_value(params: dict[str, object], named: str) -> None:
    with pytest.raises(JobConfigError, match=named):
        apply_params(TINY, params)


@pytest.mark.parametrize(("params", "named"), [
    ({"steps": 10**9 + 1}, "DAG param 'steps' = 1000000001: must be >= 1 and <= 1000000000"),
    ({"steps": "1" * 40}, f"DAG param 'steps' = '{'1' * 40}': must be an integer >= 1 and "
                          "<= 1000000000"),
    ({"inject_fault": "kill", "fault_at_step": 10**12},
     "DAG param 'fault_at_step' = 1000000000000: must be >= 1 and <= 1000000000"),
    ({"inject_fault": "kill", "fault_attempt": 10_001},
     "DAG param 'fault_attempt' = 10001: must be >= 1 and <= 10000"),
])
def test_trigger_form_numbers_out_of_range_are_named(params: dict[str, object],
                                                     named: str) -> None:
    with pytest.raises(JobConfigError) as info:
        apply_params(TINY, params)
    assert str(info.value) == named


def test_a_fault_beyond_the_steps_is_refused_at_parse_time_and_at_trigger(
        tmp_path: Path) -> None:
    """A fault the job never reaches would never fire and say nothing: the DAG's own
    faults against its steps when the file is parsed, and a form's steps or fault step
    when the run starts (before the trainer does)."""
    with pytest.raises(JobConfigError, match=r"^trainer config: faults\[0\].at_step = 31: "
                                             r"must be at most steps \(30\)"):
        check_trainer_config({**TINY, "faults": [{"kind": "kill", "at_step": 31}]})
    paths = job_paths(tmp_path, "dag", "run")
    with pytest.raises(JobConfigError, match=r"faults\[0\].at_step = 31: must be at most "
                                             r"steps \(30\)"):
        materialize(TINY, {"inject_fault": "kill", "fault_at_step": 31}, paths)
    with pytest.raises(JobConfigError, match=r"faults\[0\].at_step = 20: must be at most "
                                             r"steps \(10\)"):
        materialize({**TINY, "faults": [{"kind": "raise", "at_step": 20}]}, {"steps": 10},
                    paths)
    assert not paths.config_file.exists()


def test_faults_at_a_rank_beyond_the_world_and_cursors_past_64_bits_fail_at_parse_time(
        ) -> None:
    with pytest.raises(JobConfigError, match=r"faults\[0\].rank = 2: must be below the "
                                             r"job's world size \(2\)"):
        check_trainer_config({**TINY, "faults": [{"kind": "kill", "at_step": 3, "rank": 2}]},
                             nproc=2)
    with pytest.raises(JobConfigError, match=r"^trainer config: steps = 1000000000: x "
                                             r"batch_size 1048576 x 9000 process\(es\) is a "
                                             r"data cursor past"):
        check_trainer_config({**TINY, "steps": 10**9, "batch_size": 2**20, "compile": False},
                             nproc=9000)


def test_check_rejects_managed_paths_and_bad_trainer_fields() -> None:
    with pytest.raises(JobConfigError, match="checkpoint_dir"):
        check_trainer_config({**TINY, "checkpoint_dir": "/x"})
    with pytest.raises(JobConfigError, match="checkpoint_interval = 'often'"):
        check_trainer_config({**TINY, "checkpoint_interval": "often"})
    with pytest.raises(JobConfigError, match="unknown field"):
        check_trainer_config({**TINY, "stpes": 3})
    assert check_trainer_config(TINY).steps == 30


def test_the_typed_trainer_config_has_every_field_the_trainer_reads(tmp_path: Path) -> None:
    """`TrainerSpec` and `TrainerFile` name the trainer config's fields, no more and no
    fewer: a field the trainer gains is a key the operators' types gain too."""
    from dataclasses import fields

    from airflow_ett.operators.lifecycle import training_job
    from airflow_ett.trainer.config import TrainerConfig, load_config

    trainer = {f.name for f in fields(TrainerConfig)} | {"model_config", "model_code_path"}
    assert set(TrainerSpec.__annotations__) == trainer - set(MANAGED_FIELDS)
    assert set(TrainerFile.__annotations__) == trainer - {"events_file"}  # never written
    own = trainer - set(TrainerOptions.__annotations__) - set(MANAGED_FIELDS)
    with pytest.raises(JobConfigError, match="have their own parameters") as info:
        training_job("typed", model="dlrm_tiny", steps=3,
                     trainer_options=dict.fromkeys(sorted(own), 1))  # type: ignore[arg-type]
    assert str(sorted(own)) in str(info.value)
    paths = job_paths(tmp_path, "dag", "run")
    materialize(TINY, {}, paths)  # the file the one writer wrote, by the one reader
    assert set(json.loads(paths.config_file.read_text())) <= set(TrainerFile.__annotations__)
    assert load_config(paths.config_file).steps == TINY["steps"]


def test_materialize_writes_one_config_every_task_reads(tmp_path: Path) -> None:
    paths = job_paths(tmp_path, "dag", "run")
    cfg = materialize(TINY, {"steps": 9}, paths)
    assert cfg.steps == 9 and cfg.checkpoint_dir == paths.checkpoint_dir
    first = paths.config_file.read_bytes()
    materialize(TINY, {"steps": 9}, paths)  # a second task writes the same bytes
    assert paths.config_file.read_bytes() == first
    assert json.loads(first)["compile_cache_dir"] == str(paths.compile_cache_dir)
    assert [p.name for p in paths.job_dir.iterdir()] == ["trainer.json"]  # no temp files


@pytest.mark.parametrize(("params", "named"), [
    ({"steps": 12.5}, "'steps' = 12.5: must be an integer"),
    ({"steps": "12.5"}, "'steps' = '12.5': must be an integer"),
    ({"steps": True}, "'steps' = True: must be an integer"),
    ({"inject_fault": "kill", "fault_at_step": 2.9}, "'fault_at_step' = 2.9"),
    ({"inject_fault": ["kill"]}, "'inject_fault' = \\['kill'\\]"),
    ({"inject_fault": "kill", "fault_attempt": "1.0"}, "'fault_attempt' = '1.0'"),
])
def test_trigger_form_values_are_not_truncated(params: dict[str, object], named: str) -> None:
    with pytest.raises(JobConfigError, match=named):
        apply_params(TINY, params)


def test_a_non_mapping_trainer_config_is_named() -> None:
    with pytest.raises(JobConfigError, match="trainer_config = \\['model'\\]: must be a map"):
        check_trainer_config(["model"])  # type: ignore[arg-type]


def test_a_work_dir_nobody_can_write_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    paths = job_paths(tmp_path / "f", "dag", "run")  # under a file: never writable
    with pytest.raises(JobConfigError, match=r"work_dir = '.*f': cannot write the job's files"):
        materialize(TINY, {}, paths)


def test_train_operator_arguments_are_read_typed() -> None:
    assert check_train_args("T", restarts=2, publish_in_task=False,
                            attempt_timeout_s=None) == (2, False, None)
    cases: list[tuple[dict[str, object], str]] = [
        ({"restarts": True}, "restarts = True"),
        ({"publish_in_task": "no"}, "publish_in_task = 'no': must be true or false"),
        ({"attempt_timeout_s": float("inf")}, "attempt_timeout_s = inf: must be a finite"),
        ({"attempt_timeout_s": float("nan")}, "attempt_timeout_s = nan"),
        ({"attempt_timeout_s": 1e308}, r"attempt_timeout_s = 1e\+308: must be > 0 and <= "
                                       "2592000.0"),
        ({"restarts": 101}, "restarts = 101: must be >= 0 and <= 100"),
    ]
    for kwargs, named in cases:
        args: dict[str, object] = {"restarts": 1, "publish_in_task": False,
                                   "attempt_timeout_s": None, **kwargs}
        with pytest.raises(JobConfigError, match=named):
            check_train_args("T", **args)
