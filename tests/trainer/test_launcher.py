"""How an attempt's exit is read: what a restart can heal, and who reports it."""

from __future__ import annotations

import signal

import pytest

from airflow_ett.trainer.launcher import classify_exit, run_attempts, trainer_command


@pytest.mark.parametrize(
    ("code", "status", "cause", "retryable", "reported"),
    [
        (0, "success", None, False, True),
        (1, "failed", "application", True, True),
        (75, "failed", "preemption", True, True),
        (78, "failed", "application", False, True),
        (70, "failed", "infra", True, True),  # hung: its watchdog reported and left
        (-signal.SIGKILL, "failed", "infra", True, False),
        (128 + signal.SIGKILL, "failed", "infra", True, False),
        (-signal.SIGSEGV, "failed", "infra", True, False),
        (-signal.SIGTERM, "failed", "preemption", True, False),
        (3, "failed", "unknown", True, False),
    ],
)
def test_classify_exit(code: int, status: str, cause: str | None, retryable: bool,
                       reported: bool) -> None:
    got = classify_exit(code)
    assert (got.status, got.cause, got.retryable, got.reported_by_child) == (
        status, cause, retryable, reported)


def test_commands() -> None:
    assert trainer_command("job.toml", python="/v/bin/python") == [
        "/v/bin/python", "-m", "airflow_ett.trainer", "--config", "job.toml"]
    cmd = trainer_command("job.toml", nproc=2, prewarm=True, python="/v/bin/python")
    assert cmd[:4] == ["/v/bin/torchrun", "--standalone", "--nproc-per-node", "2"]
    assert cmd[-1] == "--prewarm"
    with pytest.raises(ValueError, match="max_attempts = 0"):
        run_attempts("job.toml", "j", max_attempts=0)
