"""The command train operator's parse-time checks, its log-line progress, and the
launcher's view of a command (exit records say whether it reported its own end)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.operators import CommandTrainOperator, JobConfigError, training_job
from airflow_ett.operators.log_progress import LogProgress, compile_pattern
from airflow_ett.trainer.launcher import Command, NotStartable, run_attempts


class Recorder:
    def __init__(self) -> None:
        self.spans: list[tuple[Any, ...]] = []

    def progress(self, *args: Any) -> None:
        self.spans.append(args)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"command": []}, "command = []: must have at least 1 item(s)"),
    ({"command": "python train.py"}, "command = 'python train.py': must be a list"),
    ({"command": ["", "x"]}, "command[0] = '': must be a non-empty string"),
    ({"command": ["python", "a\0b"]}, "command[1] = 'a\\x00b': must not hold a NUL byte"),
    ({"command": ["x"], "grace_s": float("nan")}, "grace_s = nan: must be a finite number"),
    ({"command": ["x"], "progress_pattern": "(?P<step>"}, "not a regular expression"),
    ({"command": ["x"], "progress_pattern": r"step \d+"}, "must have a named group 'step'"),
    ({"command": ["x"], "env": {"A": 1}}, "env['A'] = 1: must be a string"),
    ({"command": ["x"], "restarts": -1}, "restarts = -1: must be >= 0"),
])
def test_a_bad_argument_is_one_line_naming_it(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(JobConfigError, match=r"^CommandTrainOperator: ") as caught:
        CommandTrainOperator(task_id="train", **kwargs)
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"command": ["x"], "steps": 5}, "['steps'] configure our trainer"),
    ({"command": ["x"], "data": {"format": "parquet"}}, "['data'] configure our trainer"),
    ({"command": ["x"], "queues": {"publish": "cpu"}}, "a command job has one task"),
    ({"command": ["x"], "model": {"name": "dlrm"}}, "must be a name"),
    ({}, "needs model= and steps="),
])
def test_a_command_job_refuses_our_trainers_parameters(kwargs: dict[str, Any],
                                                       said: str) -> None:
    with pytest.raises(JobConfigError, match=r"^training_job: |^CommandTrainOperator: ") \
            as caught:
        training_job("cmd", **kwargs)
    assert said in str(caught.value)


def test_a_command_job_is_the_train_task_in_the_dag_folder() -> None:
    dag = training_job("cmd", command=["python", "train.py", "--lr", "{{ params.lr }}"],
                       model="ctr", tenant="ads", progress_pattern=r"step (?P<step>\d+)")
    (train,) = dag.tasks
    assert isinstance(train, CommandTrainOperator) and train.task_id == "train"
    assert train.cwd == str(Path(__file__).resolve().parent)  # beside the DAG file
    assert train.queue == "gpu" and "command" in train.template_fields
    assert {"ett", "ett:tenant=ads", "ett:model=ctr"} <= set(dag.tags)


def test_log_lines_become_progress_spans() -> None:
    pattern = compile_pattern("t", r"^step (?P<step>\d+)(?: cursor (?P<cursor>\d+))?"
                                   r" loss (?P<loss>\S+)")
    assert pattern is not None
    recorder = Recorder()
    reader = LogProgress(pattern, recorder)  # type: ignore[arg-type]
    for i, line in enumerate(["loading", "step 1 loss 0.9", "step 2 loss nan",
                              "step 3 cursor 96 loss 0.5", "step 99999999999999999999 loss 1",
                              "step 4 loss 0.4"]):
        reader.line(line, ts=100.0 + i / 10)
    reader.close()
    # step 1 ends with no known start (start-up); 2 and 3 follow it: one span (a loss
    # that is not a number is none); a step number past 64 bits is no step; step 4's
    # cursor goes back (a restore): the span ends, and step 4's start is unknown again
    assert recorder.spans == [(1, 3, 1, 96, 100.1, 100.3, 0.5)]


def test_a_command_that_reports_nothing_has_its_ends_reported(tmp_path: Path) -> None:
    seen: list[Any] = []
    result = run_attempts(Command.of([sys.executable, "-c", "import sys; sys.exit(0)"]),
                          "j", max_attempts=1, report_unreported=seen.append)
    (only,) = result.attempts
    assert only.exit_code == 0 and not only.exit_class.reported_by_child
    assert seen == [only]  # the task reports the success the command did not


def test_a_command_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(NotStartable, match=r"^command ./no/such/trainer.: cannot start it "
                                           "here: No such file or directory"):
        run_attempts(Command.of(["/no/such/trainer"]), "j", max_attempts=2)


def test_under_torchrun_each_rank_runs_the_command_as_given() -> None:
    command = Command.of(["train", "--x"], nproc=4, python="/v/bin/python")
    assert command.argv == ("/v/bin/torchrun", "--standalone", "--nproc-per-node", "4",
                            "--no-python", "train", "--x")
    assert command.records and command.standby_argv is None
