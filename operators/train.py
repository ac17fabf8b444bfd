"""`TorchRecTrainOperator`: the GPU task of a lifecycle job.

It starts the trainer as a child process (alone, or under torchrun), streams its log into
the task log, and restarts it in place after a failure a restart can heal: no trip
through the scheduler, no new placement, which is the cheapest recovery there is. Only
when the in-place restarts are spent does the failure go to Airflow's retry (a new try,
maybe on another worker), which restores from the same checkpoints. Each failure's cause
comes from the exit code or signal (`airflow_ett.trainer.launcher.classify_exit`), and
under torchrun (`nproc` > 1), whose exit code is 1 for any failed rank, from the rank
whose failure the others followed (`classify_ranks`, docs/decisions/0017-multi-rank.md):
a SIGKILLed rank is infra, a rank that raised is application. A config the trainer
refuses (exit 78, on any rank) fails the task without retries; the exception, the retry
and the ETT `attempt_ended` cause agree, since they all come from that one class.

The operator also records what the trainer cannot: an attempt's start as the launcher
sees it, the end of an attempt that was killed (a SIGKILLed process says nothing) or
whose root cause rank 0 did not report itself (a peer rank's death: rank 0 saw only the
error it caused), and the moment the job releases its GPUs (`job_ended`), which is where
E2E stops. Multi-node: docs/multi-node.md (one launcher task per job).

Preemption on request (`airflow_ett/scheduling/request.py`): while the trainer runs, the
task watches its job directory for the preemption controller's request. A `now` request:
it sends the trainer SIGTERM (checkpoint within the tenant's grace period, or, with
`skip_save`, no save at all; exit 75). An `at_checkpoint` request: it signals nothing;
the trainer claims it at its next periodic save (renamed to
`preempt_request.claimed.json`) and leaves right after that save commits (exit 75, no
exit save); if the request's `leave_by` passes first, the task falls back to SIGTERM. If
the request is withdrawn (its file gone, and not claimed: one rename wins), the trainer
goes on as if nothing had been asked, restartable in place again, and a later request is
watched for. Either way, once the trainer left on a request (exit 75, or the claimed file
naming the request: under torchrun the exit code says nothing), the task does not
restart it in place and hands the GPUs back with `AirflowRescheduleException`: the task
goes UP_FOR_RESCHEDULE, which spends no retry (Airflow keeps its try number) and is no
failure, and runs again `resume_after_s` later, restoring the checkpoint just saved.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import Any

from airflow_ett._proc import ProcessTree
from airflow_ett.jobs import attempt_id_for
from airflow_ett.operators.base import EttTrainerOperator
from airflow_ett.operators.errors import (
    TrainerConfigError,
    TrainerPreempted,
    default_retry_policy,
    failure_for,
)
from airflow_ett.operators.job import JobConfigError, JobPaths, check_train_args
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.launcher import AttemptOutcome, LaunchResult, run_attempts

ATTEMPTS_KEY = "ett_attempts_launched"
#: How often the task looks for a preemption request while its trainer runs.
REQUEST_POLL_S = 1.0


class _RequestWatcher:
    """Polls the job directory for a preemption request while the trainer runs.

    A `now` request: `act(request, why)` once (from this thread), and the watch ends. An
    `at_checkpoint` one (pending, or already claimed by the trainer, which may take it
    before a look here saw it): `hold(request)` (no restart in place: the trainer leaves
    by itself at its next checkpoint), then the file is read again each poll: rewritten
    as `now` (escalated), or past its `leave_by`, it is acted on as `now`; gone and
    claimed, the trainer is leaving on it: it stands; gone and not claimed (withdrawn),
    `release(request)` and the watch goes on, for a later request. A request made before
    this execution began is stale (the controller saw an earlier one, which ended
    meanwhile): it is put aside, not acted on; so is a claimed one an earlier execution
    left (its task ended before archiving it)."""

    def __init__(self, job_dir: Any, act: Any, hold: Any = None, release: Any = None,
                 poll_s: float = REQUEST_POLL_S) -> None:
        self.job_dir, self._act, self._poll_s = job_dir, act, poll_s
        self._hold = hold or (lambda request: None)
        self._release = release or (lambda request: None)
        self.began = time.time()
        self.request: Any = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ett-preempt-watch",
                                        daemon=True)

    def __enter__(self) -> _RequestWatcher:
        from airflow_ett.scheduling.request import archive_claimed

        archive_claimed(self.job_dir)  # this execution's trainer has not started yet
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5.0)

    def final_request(self) -> Any:
        """Once the trainer has exited: the request it ran under, or one it claimed and
        left on between two looks (the claim is this execution's: see `__enter__`)."""
        from airflow_ett.scheduling.request import read_claimed

        return self.request if self.request is not None else read_claimed(self.job_dir)

    def _run(self) -> None:
        from airflow_ett.scheduling.request import archive_request, read_claimed, read_request

        while not self._done.wait(self._poll_s):
            request = read_request(self.job_dir)
            if self.request is not None:
                if self._settled(request):
                    return
                continue
            if request is None:
                request = read_claimed(self.job_dir)
                if request is None:
                    continue
            elif request.requested_at < self.began:
                archive_request(self.job_dir)
                continue
            self.request = request
            if request.mode == "now":
                self._act(request, "preemption request")
                return
            self._hold(request)

    def _settled(self, request: Any) -> bool:
        """An `at_checkpoint` request is held: follow what its file says now. True: the
        watch is over (acted on)."""
        from airflow_ett.scheduling.request import is_claimed

        if request is None:
            if not is_claimed(self.job_dir, self.request):
                self._release(self.request)
                self.request = None  # withdrawn: watch for the next one
                return False
            request = self.request  # claimed: the trainer is leaving on it; it stands
        self.request = request
        if request.mode == "now":
            self._act(request, "preemption request escalated to now")
            return True
        if time.time() >= request.leave_by:
            self._act(request, "no checkpoint by the request's leave_by")
            return True
        return False


class _StopLaunches(threading.Event):
    """`run_attempts`' stop: set (the task is being killed, or holds a request), or the
    trainer claimed a request: no restart in place after an attempt that left on it, even
    one that left before the watcher's next look saw the claim."""

    def __init__(self, job_dir: Any) -> None:
        from airflow_ett.scheduling.request import claimed_path

        super().__init__()
        self._claimed = claimed_path(job_dir)

    def is_set(self) -> bool:
        return super().is_set() or self._claimed.exists()


def first_attempt_number(launched_before: int | None, try_number: int, restarts: int) -> int:
    """The trainer's attempt number (1-based, over the whole job) for this try's first
    launch. The task state store remembers how many ran before; without it, each earlier
    try is assumed to have used all its launches (numbers stay unique, maybe not dense)."""
    if launched_before is not None and launched_before >= 0:
        return launched_before + 1
    return (max(try_number, 1) - 1) * (restarts + 1) + 1


def _preemptions_before(job_dir: Any) -> int:
    """How many preemption requests this job has acted on (archived in its directory)."""
    from pathlib import Path

    return len(list(Path(job_dir).glob("preempt_request.*.done.json")))


class TorchRecTrainOperator(EttTrainerOperator):
    """Train a TorchRec model: in-place restarts first, Airflow retries after.

    :param restarts: in-place restarts of the trainer per Airflow try (0: none).
    :param publish_in_task: publish the model inside this task, holding the GPUs (the
        baseline; the lifecycle default publishes in a separate CPU task).
    :param attempt_timeout_s: kill an attempt that runs longer than this (a backstop for
        hangs the trainer's own watchdog missed); None: no limit.
    """

    ett_role = "train"
    ui_color = "#d8e8fd"

    def __init__(self, *, queue: str = "gpu", restarts: int = 1, publish_in_task: bool = False,
                 attempt_timeout_s: float | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("retry_policy", default_retry_policy())
        super().__init__(queue=queue, **kwargs)
        self.restarts, self.publish_in_task, self.attempt_timeout_s = check_train_args(
            type(self).__name__, restarts=restarts, publish_in_task=publish_in_task,
            attempt_timeout_s=attempt_timeout_s)
        # Run state lives in execute (Airflow deep-copies operators; a lock cannot be).
        self._proc: subprocess.Popen[str] | None = None
        self._killed: threading.Event | None = None
        self._on_kill = False  # on_kill came: a withdrawn request must not undo its stop
        self._grace_s = 30.0

    def execute(self, context: Mapping[str, Any]) -> dict[str, Any]:
        ti = context["ti"]
        self._killed = threading.Event()
        self._on_kill = False
        try:
            paths, cfg = self.prepare(context)
        except JobConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        self._killed = killed = _StopLaunches(paths.job_dir)
        self._grace_s = cfg.grace_s
        job = self.job_id(context)
        store = context.get("task_state_store")
        try_number = int(ti.try_number)
        first = first_attempt_number(self._launched_before(store), try_number, self.restarts)
        # A preemption reschedules the task in the same try: the restarts after it are
        # numbered on, so attempt ids stay unique (`<try>.<restart>`).
        offset = _preemptions_before(paths.job_dir) * (self.restarts + 1)

        def on_start(proc: subprocess.Popen[str], number: int, attempt: str) -> None:
            self._proc = proc
            self.emitter(context, attempt).attempt_started(ts=time.time())
            self.log.info("attempt %s (job attempt #%d) started: pid %d", attempt, number,
                          proc.pid)
            if store is not None:
                try:
                    store.set(ATTEMPTS_KEY, number)
                except Exception as exc:  # the count is an aid, not a requirement
                    self.log.warning("cannot record the attempt count: %s", exc)

        def report_killed(outcome: AttemptOutcome) -> None:
            cls = outcome.exit_class
            self.emitter(context, outcome.attempt_id).attempt_ended(
                cls.status, cls.cause, exit_code=outcome.exit_code, message=cls.description,
                detected_ts=outcome.ended, ts=outcome.ended)

        with _RequestWatcher(paths.job_dir, self._yield_gpus, self._yield_at_checkpoint,
                             self._request_withdrawn) as watcher:
            result = run_attempts(
                paths.config_file, job, max_attempts=self.restarts + 1, first_attempt=first,
                nproc=self.nproc,
                attempt_id=lambda n: attempt_id_for(try_number, offset + n - first + 1),
                env=self.child_env(paths), cwd=paths.job_dir, report_unreported=report_killed,
                on_start=on_start, on_output=self.log.info, timeout=self.attempt_timeout_s,
                stop=killed, warm_standby=cfg.optimizations.warm_standby,
            )
        self._proc = None
        request = watcher.final_request()
        if request is not None:
            self._after_request(context, request, result, paths)
        if not result.attempts:
            raise TrainerPreempted("the task was stopped before the trainer started")
        for outcome in result.attempts:
            self.log.info("attempt %s: exit %d, %s (%.1f s)", outcome.attempt_id,
                          outcome.exit_code, outcome.exit_class.description,
                          outcome.ended - outcome.started)
        if result.succeeded:
            return self._succeeded(context, result, (paths, cfg))
        self._failed(context, result, last_try=try_number > int(ti.max_tries))
        raise AssertionError("unreachable")  # pragma: no cover

    def _launched_before(self, store: Any) -> int | None:
        if store is None:
            return None
        try:
            value = store.get(ATTEMPTS_KEY)
        except Exception as exc:
            self.log.warning("cannot read the attempt count: %s", exc)
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _succeeded(self, context: Mapping[str, Any], result: LaunchResult,
                   prepared: tuple[JobPaths, TrainerConfig]) -> dict[str, Any]:
        emitter = self.emitter(context)
        published = None
        if self.publish_in_task:
            from airflow_ett.operators.publish import publish_job

            with emitter.phase("publish_in_gpu"):
                published = publish_job(self, context, self.log, prepared)
        emitter.job_ended("success")
        emitter.flush()
        return {
            "attempts": [o.attempt_id for o in result.attempts],
            "exit_codes": [o.exit_code for o in result.attempts],
            "published": published,
        }

    def _failed(self, context: Mapping[str, Any], result: LaunchResult, *,
                last_try: bool) -> None:
        last = result.last
        cls = last.exit_class
        message = (f"attempt {last.attempt_id} failed: {cls.description} (exit "
                   f"{last.exit_code}, cause {cls.cause}) after {len(result.attempts)} "
                   f"launch(es) in this try")
        emitter = self.emitter(context)
        if not cls.retryable or last_try:
            emitter.job_ended("failed")
        emitter.flush()
        if not cls.retryable:
            raise TrainerConfigError(message)
        raise failure_for(cls.cause)(message, exit_code=last.exit_code)

    def _yield_gpus(self, request: Any, why: str = "preemption request") -> None:
        """The controller asked this job to give its GPUs to another now (or its
        checkpoint did not come in time): no restart in place after this attempt; the
        trainer checkpoints and leaves within the grace period (or, when the request says
        `skip_save`, leaves after its current step without saving: the trainer reads
        that from the request itself)."""
        self.log.warning("preemption requested (%s): %s", why, request.reason)
        if self._killed is not None:
            self._killed.set()
        self._terminate(request.grace_s, why=why)

    def _yield_at_checkpoint(self, request: Any) -> None:
        """Asked to yield at the next checkpoint: no restart in place after this attempt,
        and no signal: the trainer leaves by itself once that checkpoint committed."""
        self.log.warning("preemption requested at the next checkpoint (by %s at the "
                         "latest): %s", time.strftime("%H:%M:%S", time.gmtime(
                             request.leave_by)), request.reason)
        if self._killed is not None:
            self._killed.set()

    def _request_withdrawn(self, request: Any) -> None:
        """The controller took its `at_checkpoint` request back before the trainer claimed
        it: the trainer goes on, restartable in place again (unless on_kill came)."""
        self.log.warning("preemption at checkpoint withdrawn (%s no longer waits): training "
                         "goes on", request.for_job)
        if self._killed is not None and not self._on_kill:
            self._killed.clear()

    def _after_request(self, context: Mapping[str, Any], request: Any, result: LaunchResult,
                       paths: JobPaths) -> None:
        """Yield (reschedule) when the trainer left preempted (exit 75, or it claimed the
        request: torchrun hides the exit 75); a request that came as the trainer ended
        anyway is put aside, and the outcome stands."""
        from airflow_ett.scheduling.request import archive_request, take_claimed

        claimed = take_claimed(paths.job_dir, request)  # archived as done, if it is there
        if result.attempts and (result.last.exit_class.cause == "preemption"
                                or claimed is not None):
            self._rescheduled(context, request, paths, claimed)
        self.log.warning("a preemption request came as the trainer ended (%s); nothing to "
                         "yield", result.last.exit_class.description if result.attempts
                         else "not started")
        archive_request(paths.job_dir)

    def _rescheduled(self, context: Mapping[str, Any], request: Any, paths: JobPaths,
                     claimed: Any = None) -> None:
        from datetime import UTC, datetime, timedelta

        from airflow.exceptions import AirflowRescheduleException

        from airflow_ett.scheduling.limits import RESUME_AFTER_S
        from airflow_ett.scheduling.request import archive_request

        done = archive_request(paths.job_dir) or claimed
        self.emitter(context).flush()
        # parse_request bounds it; a request built otherwise must not overflow the date
        resume_after_s = RESUME_AFTER_S.clamp(request.resume_after_s)
        self.log.warning("preempted for %s: the GPUs go back to the scheduler; this task runs "
                         "again in %.0f s from its checkpoint, with no retry spent (request "
                         "kept as %s)", request.for_job, resume_after_s, done)
        raise AirflowRescheduleException(  # type: ignore[no-untyped-call]
            reschedule_date=datetime.now(UTC) + timedelta(seconds=resume_after_s))

    def on_kill(self) -> None:
        """Ask the trainer to checkpoint and leave (SIGTERM: it exits 75 after saving),
        within its grace period; after that, SIGKILL every process of the attempt.

        SIGTERM goes to the top process only: torchrun forwards it to its ranks, and a
        trainer stops its own data workers; signalled directly, they would die mid-step.
        The tree is recorded before the signal, since ranks run in sessions of their own
        and outlive a killed torchrun as orphans, holding the GPUs."""
        self._on_kill = True
        if self._killed is not None:
            self._killed.set()  # no in-place restart after this
        self._terminate(self._grace_s, why="on_kill")

    def _terminate(self, grace_s: float, *, why: str) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        tree = ProcessTree(proc)
        self.log.info("%s: SIGTERM to the trainer (pid %d; %d process(es) in its tree), "
                      "grace %.0f s", why, proc.pid, len(tree.alive()), grace_s)
        ended = tree.terminate(grace_s=grace_s + 5.0, roots_only=True)
        if ended.killed:
            self.log.warning("%s: the trainer outlived its grace period: SIGKILL to %s", why,
                             list(ended.killed))
        if ended.left:
            self.log.error("%s: processes of the trainer still run after SIGKILL: %s", why,
                           list(ended.left))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
