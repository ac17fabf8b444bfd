"""Leaving when asked (preemption, `airflow_ett/protocol/request.py`): our trainer's side.

SIGTERM makes the attempt finish its step, save (unless the current step is saved
already) and exit 75 within the grace; when the pending request says `skip_save` (its
save would not fit the grace) it exits 75 at once, saving nothing. An `at_checkpoint`
request in the job directory (`$ETT_JOB_DIR`) is looked for at each periodic save, one
small file read and rename (the claim) by rank 0, its verdict broadcast so every rank
leaves alike: once that save has committed the attempt exits 75 too, saving nothing more.
Nothing is read between saves.

What a request asks and the claim itself are the protocol's, torch-free and shared with
every adapter (`protocol/leave.py`, `protocol/states.py`); what is here needs the process
group and the checkpoint manager: rank 0's verdict on every rank, the waits for a save in
flight, the exit save, and the exit that leaves a save in flight behind (`exit_now`).
The loop calls `Leaving` at its two points (a periodic save, SIGTERM between steps);
which saves those are is `checkpoint_timing.py`'s list.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import torch.distributed as dist

from airflow_ett.emit import Emitter
from airflow_ett.protocol.env import JOB_DIR_ENV
from airflow_ett.protocol.exits import EXIT_PREEMPTED, exit_record
from airflow_ett.protocol.leave import preempted_message
from airflow_ett.trainer.identity import DistEnv

if TYPE_CHECKING:  # imported where used: the checkpoint manager and the data load late
    from airflow_ett.protocol.request import PreemptRequest
    from airflow_ett.trainer.checkpoint import CheckpointManager
    from airflow_ett.trainer.data import DataPipeline

log = logging.getLogger("airflow_ett.trainer")

#: Save the attempt's current step (`Trainer.save`); its result is not looked at here.
Save = Callable[[], object]


@dataclass(slots=True)
class Leaving:
    """One attempt's leaving: on which request it left (`left_for`), decided alike on
    every rank. `saved_step` arguments are the step of the latest save begun (committed
    once `manager.wait` returns), None when nothing holds the current step."""

    env: DistEnv
    grace_s: float
    # the request this attempt left on by itself: an `at_checkpoint` one after its
    # periodic save, or a `skip_save` one on SIGTERM
    left_for: PreemptRequest | None = None

    def claim_at_save(self, manager: CheckpointManager, since: float
                      ) -> PreemptRequest | None:
        """The pending `at_checkpoint` request, the same on every rank, looked for as a
        periodic save begins: rank 0 claims it (`request.claim_request`, a rename that
        either wins over a withdrawal or finds the request gone: then there is none), and
        only then does the checkpoint group carry the verdict, so no rank leaves on a
        request the controller took back. One made before `since` (this attempt's start)
        is not this attempt's: the train task puts it aside."""
        from airflow_ett.protocol.leave import claim_at_save
        from airflow_ett.protocol.request import parse_request

        found: str | None = None
        if self.env.is_reporter:
            request = claim_at_save(job_dir(), since=since)
            if request is not None:
                found = request.to_json()
        found = manager.broadcast(found)
        return parse_request(found) if found is not None else None

    def at_checkpoint(self, request: PreemptRequest, manager: CheckpointManager, step: int,
                      save: Save) -> None:
        """Wait for the save just begun to commit (by the request's `leave_by` + grace),
        then the attempt leaves on it; if it failed, save once more within the grace."""
        from airflow_ett.trainer.checkpoint import CheckpointError

        self.left_for = request
        log.warning("preemption at checkpoint step %d: leaving once it is committed (%s)",
                    step, request.reason)
        deadline = request.leave_by + request.grace_s
        try:
            manager.wait(timeout=max(0.0, deadline - time.time()))
            return
        except CheckpointError as exc:
            log.error("the checkpoint to leave on failed (%s): saving again", exc)
        except TimeoutError as exc:
            log.error("the checkpoint to leave on is not committed by the deadline: %s", exc)
            return
        # on the request all the same; None: nothing holds this step
        self.save_and_leave(manager, step, None, save, time.time() + request.grace_s)

    def on_sigterm(self, manager: CheckpointManager, step: int, saved_step: int | None,
                   save: Save, received_at: float | None) -> int:
        """Save the current step (unless it is saved already) within the grace after
        SIGTERM (`received_at`), then leave preempted. A pending request that says
        `skip_save` (its save would not fit the grace: the kill would cut it) makes the
        attempt leave at once instead, saving nothing and waiting for no save in flight:
        the GPUs are free now rather than at the end of the grace."""
        unsaved = self._skip_save_request(manager)
        if unsaved is not None:
            self.left_for = unsaved
            log.warning("preempted: leaving at step %d without saving, as asked (the exit "
                        "save would not fit the grace; the last checkpoint is step %s): %s",
                        step, manager.latest_step(), unsaved.reason)
            return EXIT_PREEMPTED
        deadline = (received_at or time.time()) + self.grace_s
        return self.save_and_leave(manager, step, saved_step, save, deadline)

    def save_and_leave(self, manager: CheckpointManager, step: int, saved_step: int | None,
                       save: Save, deadline: float) -> int:
        """Save `step` (unless it is saved already) by `deadline`, then leave preempted."""
        try:
            if _current_step_saved(manager, step, saved_step, deadline):
                log.info("preempted: step %d is checkpointed already: no exit save", step)
            else:
                save()
                manager.wait(timeout=max(0.0, deadline - time.time()))
        except Exception as exc:
            log.error("preempted: the checkpoint did not finish within the grace period: %s", exc)
        return EXIT_PREEMPTED

    def _skip_save_request(self, manager: CheckpointManager) -> PreemptRequest | None:
        """The pending request when it says `skip_save`, the same on every rank: rank 0
        reads it (one small file read, on this path only) and every rank gets its verdict
        (`_agree_now`)."""
        from airflow_ett.protocol.leave import skip_save_request
        from airflow_ett.protocol.request import parse_request

        found: str | None = None
        if self.env.is_reporter:
            request = skip_save_request(job_dir())
            if request is not None:
                found = request.to_json()
        found = self._agree_now(manager, found)
        return parse_request(found) if found is not None else None

    def _agree_now(self, manager: CheckpointManager, value: str | None) -> str | None:
        """Rank 0's `value` on every rank, without waiting for a save in flight:
        `manager.broadcast` waits for it under a group (that save's commit runs
        collectives on the checkpoint group), so with one in flight the verdict goes over
        the default group, which the background commit never uses. Whether one is in
        flight is the same on every rank (`CheckpointManager.in_flight`)."""
        if not (dist.is_initialized() and manager.in_flight):
            return manager.broadcast(value)
        box: list[str | None] = [value]
        dist.broadcast_object_list(box, src=0, device=self.env.device)
        found: str | None = box[0]
        return found

    def message(self) -> str:
        """The `attempt_ended` message of a preempted attempt (`protocol.leave`)."""
        return preempted_message(self.left_for, job_dir())

    def unsaved_with_save_in_flight(self, manager: CheckpointManager | None) -> bool:
        """Left without saving, as asked, while a save is in flight: `exit_now`."""
        left_for = self.left_for
        return (left_for is not None and left_for.skip_save and manager is not None
                and manager.in_flight)


def _current_step_saved(manager: CheckpointManager, step: int, saved_step: int | None,
                        deadline: float) -> bool:
    """Wait (by `deadline`) for the save in flight; True when the current step is in a
    committed checkpoint: saving it again would only cost the grace."""
    from airflow_ett.trainer.checkpoint import CheckpointError

    try:
        manager.wait(timeout=max(0.0, deadline - time.time()))
    except CheckpointError as exc:
        log.error("preempted: the checkpoint in flight failed (%s): saving again", exc)
        return False
    return saved_step == step


def exit_now(manager: CheckpointManager | None, pipeline: DataPipeline | None,
             emitter: Emitter, code: int) -> NoReturn:
    """Leave without saving while a save is in flight: closing the checkpoint manager,
    or the interpreter's exit (which joins its writer thread), would wait for that save,
    which is known not to fit the grace. Its step directory stays uncommitted (the next
    attempt removes it) and the newest committed checkpoint is what resumes."""
    log.warning("leaving without waiting for the checkpoint in flight")
    # a commit half reported is worse than none: wait out one being written, stop the rest
    if manager is not None and not manager.commit_lock.acquire(timeout=5.0):
        log.warning("a checkpoint commit did not finish within 5 s: leaving anyway")
    if pipeline is not None:
        try:
            pipeline.close()
        except Exception as exc:
            log.warning("teardown: %s", exc)
    emitter.close()
    exit_record.exit(code)
    logging.shutdown()
    os._exit(code)


def job_dir() -> Path | None:
    """The job directory the task gave (`$ETT_JOB_DIR`): where a request is left."""
    value = os.environ.get(JOB_DIR_ENV)
    return Path(value) if value else None
