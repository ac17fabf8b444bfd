"""The trainer's side of leaving: SIGTERM, the request at a checkpoint, the first step.

Any trainer process uses these (ours in `trainer/leaving.py`, every adapter in
`airflow_ett/adapters/`), so they all leave the same way:

- `PreemptionFlag`: SIGTERM (a `now` preemption request acted on by the task, or
  Airflow's on_kill) sets a flag the loop polls between steps: finish the step,
  checkpoint within the grace (`$ETT_GRACE_S`), exit 75. `skip_save_request` says
  whether the pending request asks to leave at once, unsaved (`states.on_sigterm`).
- `claim_at_save`: at each periodic save, rank 0 claims a pending `at_checkpoint`
  request (a rename, `request.claim_request`); once that save has committed the attempt
  exits 75, saving nothing more (`states.leave_at_save`).
- `signal_first_step`: create `$ETT_FIRST_STEP_FILE` once the first step has finished
  (the launcher's cue to start a warm spare, and the first progress it sees).
- `preempted_message`: the `attempt_ended` message of an attempt that left.

Nothing here imports torch: a multi-rank trainer broadcasts rank 0's verdict itself.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from airflow_ett.protocol.exits import exit_record
from airflow_ett.protocol.request import PreemptRequest, claim_request, read_request
from airflow_ett.protocol.states import on_sigterm

log = logging.getLogger("airflow_ett.protocol")


class PreemptionFlag:
    """SIGTERM (preemption, or Airflow's on_kill) sets a flag the loop polls between steps:
    finish the step, checkpoint within the grace period, exit with EXIT_PREEMPTED."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.received_at: float | None = None

    def install(self) -> bool:
        """Handle SIGTERM from now on (main thread only: False elsewhere, where Python
        cannot install a handler)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(signal.SIGTERM, self._handler)
        return True

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.time()
            exit_record.sigterm(self.received_at)
            log.warning("SIGTERM: finishing the current step, then checkpoint and exit")
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


def claim_at_save(job_dir: Path | None, *, since: float) -> PreemptRequest | None:
    """At a periodic save (rank 0 only): the `at_checkpoint` request made at or after
    `since` (this attempt's start), claimed; None when there is none to leave on. The job
    directory is shared storage: a failure to look is logged, never raised."""
    if job_dir is None:
        return None
    try:
        return claim_request(job_dir, since=since)
    except OSError as exc:
        log.warning("cannot look for a preemption request in %s: %s", job_dir, exc)
        return None


def skip_save_request(job_dir: Path | None) -> PreemptRequest | None:
    """On SIGTERM (rank 0 only): the pending request when it asks to leave unsaved."""
    if job_dir is None:
        return None
    try:
        pending = read_request(job_dir)
    except OSError as exc:
        log.warning("cannot read the preemption request in %s: %s", job_dir, exc)
        return None
    return pending if on_sigterm(pending) == "leave_unsaved" else None


def signal_first_step(path: Path | None) -> None:
    """Create the first-step file (rank 0, once its first step has finished)."""
    if path is None:
        return
    try:
        path.touch()
    except OSError as exc:
        log.warning("cannot signal the first step (%s): %s", path, exc)


def preempted_message(left_for: PreemptRequest | None, job_dir: Path | None) -> str:
    """The `attempt_ended` message of a preempted attempt: the controller's reason when a
    request asked for it (`left_for`: the one the attempt left on by itself, an
    `at_checkpoint` one or a `skip_save` one; else the pending one, acted on by SIGTERM),
    otherwise what happened."""
    if left_for is not None and left_for.skip_save:
        return (f"SIGTERM on request, left without saving (its exit save would not fit "
                f"the {left_for.grace_s:g} s grace): {left_for.reason}")[:500]
    if left_for is not None:
        return f"left at its checkpoint on request: {left_for.reason}"[:500]
    if job_dir is not None:
        request = read_request(job_dir)
        if request is not None:
            return f"SIGTERM on request, checkpointed and left: {request.reason}"[:500]
    return "SIGTERM: checkpointed and left"
