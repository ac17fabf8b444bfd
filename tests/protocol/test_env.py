"""The protocol's environment, typed, both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ett.protocol.env import TrainerEnv, TrainerEnvError


def test_the_environment_round_trips() -> None:
    env = TrainerEnv("dag/run", "1.2", 3, Path("/w/job"), Path("/w/job/checkpoints"), 12.5,
                     Path("/tmp/x"), Path("/tmp/x/first"), None, 0)
    assert TrainerEnv.from_environ(env.to_environ()) == env
    assert env.in_job and env.is_reporter


def test_outside_a_job_everything_is_empty() -> None:
    env = TrainerEnv.from_environ({})
    assert not env.in_job and env.job_dir is None and env.grace_s == 30.0


@pytest.mark.parametrize(("name", "value"), [
    ("ETT_ATTEMPT_NUMBER", "0"), ("ETT_ATTEMPT_NUMBER", "x"), ("ETT_GRACE_S", "nan"),
    ("ETT_GRACE_S", "-1"), ("ETT_GRACE_S", "1e9"), ("RANK", "-1"), ("ETT_JOB_ID", "a\nb"),
])
def test_a_bad_variable_is_one_line_naming_it(name: str, value: str) -> None:
    with pytest.raises(TrainerEnvError, match=f"^{name} = "):
        TrainerEnv.from_environ({name: value})
