"""How a failed training attempt becomes an Airflow failure, and which ones retry.

Each exception carries the failure's cause, so the task log and a `retry_policy` can
tell a preemption (retry at once: the job checkpointed and did nothing wrong) from a bad
config (never retry: it cannot heal) without parsing messages.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk.definitions.retry_policy import (
    ExceptionRetryPolicy,
    RetryAction,
    RetryPolicy,
    RetryRule,
)
from airflow.sdk.exceptions import AirflowException, AirflowFailException


class TrainerFailed(AirflowException):
    """The trainer's last attempt in this try failed; `cause` says why."""

    cause = "unknown"

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TrainerPreempted(TrainerFailed):
    cause = "preemption"


class TrainerInfraFailure(TrainerFailed):
    cause = "infra"


class TrainerApplicationError(TrainerFailed):
    cause = "application"


class TrainerConfigError(AirflowFailException):
    """A config the trainer refuses (exit 78) or the operator finds invalid: failing the
    task without retries keeps a typo from burning the job's whole retry budget."""

    cause = "application"


def failure_for(cause: str | None) -> type[TrainerFailed]:
    return {
        "preemption": TrainerPreempted,
        "infra": TrainerInfraFailure,
        "application": TrainerApplicationError,
    }.get(cause or "unknown", TrainerFailed)


def default_retry_policy() -> RetryPolicy:
    """A preempted job checkpointed before it left: retry at once, not after the task's
    retry delay (which exists for failures that may need time to clear)."""
    return ExceptionRetryPolicy(rules=[
        RetryRule(
            exception=f"{TrainerPreempted.__module__}.{TrainerPreempted.__qualname__}",
            action=RetryAction.RETRY,
            retry_delay=timedelta(0),
            reason="preempted after a checkpoint: resume at once",
        ),
    ])
