"""What the train task gives every trainer process: its environment.

One name per fact, set by the launcher for each attempt (`trainer/launcher.py`) and read
here, typed, by any trainer: ours, a command, an adapter. A trainer that reads nothing
still runs; one that reads these reports to the right job and attempt, finds the
preemption request, and tells the launcher what it needs to know.

| variable | what it is |
|---|---|
| `ETT_JOB_ID` | the job (one DAG run): `<dag_id>__<run_id>` |
| `ETT_ATTEMPT_ID` | this attempt (`<try>.<restart>`), unique in the job |
| `ETT_ATTEMPT_NUMBER` | 1-based count of the job's attempts |
| `ETT_JOB_DIR` | the job's directory (shared by its tries): the request file lives here |
| `ETT_CHECKPOINT_DIR` | where a trainer keeps its checkpoints (under the job directory) |
| `ETT_GRACE_S` | how long a SIGTERM gives to checkpoint and leave |
| `ETT_EXIT_DIR` | where this rank leaves its exit record (`rank<R>.json`) |
| `ETT_FIRST_STEP_FILE` | a file to create once the first step has finished |
| `ETT_EVENTS_FILE` | a JSON-lines events file to write instead of the store |

The store itself is Airflow's `[ett]` settings (`AIRFLOW__ETT__STORE_URL`), inherited
from the task: the emitter reads it as it does in the task.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

JOB_ENV: Final = "ETT_JOB_ID"
ATTEMPT_ENV: Final = "ETT_ATTEMPT_ID"
ATTEMPT_NUMBER_ENV: Final = "ETT_ATTEMPT_NUMBER"
JOB_DIR_ENV: Final = "ETT_JOB_DIR"
CHECKPOINT_DIR_ENV: Final = "ETT_CHECKPOINT_DIR"
GRACE_ENV: Final = "ETT_GRACE_S"
#: Where each rank of an attempt leaves its exit record (`rank<R>.json`, R the global
#: rank), read by the launcher (`trainer/launcher.py`).
EXIT_DIR_ENV: Final = "ETT_EXIT_DIR"
#: The file an attempt creates once its first step has finished (the launcher's cue to
#: start a warm spare, `trainer/standby.py`, and the first progress it can see).
FIRST_STEP_FILE_ENV: Final = "ETT_FIRST_STEP_FILE"
EVENTS_FILE_ENV: Final = "ETT_EVENTS_FILE"
#: The grace when the task says none (the trainer config's default).
DEFAULT_GRACE_S: Final = 30.0
#: The longest grace anyone may ask for (`scheduling.limits.GRACE_S`: a day).
MAX_GRACE_S: Final = 86_400.0


class TrainerEnvError(ValueError):
    """An environment variable of the protocol holds what it cannot; names it."""


@dataclass(frozen=True, slots=True)
class TrainerEnv:
    """This process's part in a job, as the train task gave it. Outside a train task
    (a script run by hand) every field is empty and `in_job` is False."""

    job_id: str | None = None
    attempt_id: str | None = None
    attempt_number: int = 1
    job_dir: Path | None = None
    checkpoint_dir: Path | None = None
    grace_s: float = DEFAULT_GRACE_S
    exit_dir: Path | None = None
    first_step_file: Path | None = None
    events_file: Path | None = None
    rank: int = 0

    @property
    def in_job(self) -> bool:
        return self.job_id is not None and self.attempt_id is not None

    @property
    def is_reporter(self) -> bool:
        """Rank 0 speaks for the attempt (its progress and its end)."""
        return self.rank == 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TrainerEnv:
        """Read the protocol's variables; a malformed one raises `TrainerEnvError`
        naming it (the launcher never writes one: a hand-set one is a mistake)."""
        env = os.environ if environ is None else environ
        return cls(
            job_id=_text(env, JOB_ENV),
            attempt_id=_text(env, ATTEMPT_ENV),
            attempt_number=_whole(env, ATTEMPT_NUMBER_ENV, 1, 1, 1 << 31),
            job_dir=_path(env, JOB_DIR_ENV),
            checkpoint_dir=_path(env, CHECKPOINT_DIR_ENV),
            grace_s=_seconds(env, GRACE_ENV),
            exit_dir=_path(env, EXIT_DIR_ENV),
            first_step_file=_path(env, FIRST_STEP_FILE_ENV),
            events_file=_path(env, EVENTS_FILE_ENV),
            rank=_whole(env, "RANK", 0, 0, 1 << 20),
        )

    def to_environ(self) -> dict[str, str]:
        """The variables for a child process (only the fields that are set)."""
        out: dict[str, str] = {}
        for name, value in ((JOB_ENV, self.job_id), (ATTEMPT_ENV, self.attempt_id),
                            (JOB_DIR_ENV, self.job_dir), (CHECKPOINT_DIR_ENV,
                                                          self.checkpoint_dir),
                            (EXIT_DIR_ENV, self.exit_dir),
                            (FIRST_STEP_FILE_ENV, self.first_step_file),
                            (EVENTS_FILE_ENV, self.events_file)):
            if value is not None:
                out[name] = str(value)
        out[ATTEMPT_NUMBER_ENV] = str(self.attempt_number)
        out[GRACE_ENV] = f"{self.grace_s:g}"
        return out


def _text(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    if len(value) > 4096 or "\n" in value:
        raise TrainerEnvError(f"{name} = {value[:60]!r}: not a one-line id")
    return value


def _path(env: Mapping[str, str], name: str) -> Path | None:
    value = _text(env, name)
    return None if value is None else Path(value)


def _whole(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    if not value.isdigit() or not low <= int(value) <= high:
        raise TrainerEnvError(f"{name} = {value[:60]!r}: not a whole number in "
                              f"[{low}, {high}]")
    return int(value)


def _seconds(env: Mapping[str, str], name: str) -> float:
    value = env.get(name)
    if value is None or value == "":
        return DEFAULT_GRACE_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_GRACE_S:  # NaN fails this too
        raise TrainerEnvError(f"{name} = {value[:60]!r}: not a number of seconds in "
                              f"[0, {MAX_GRACE_S:g}]")
    return seconds
