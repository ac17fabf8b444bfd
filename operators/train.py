"""The GPU task of a lifecycle job: `CommandTrainOperator` runs any trainer command,
`TorchRecTrainOperator` is it with our trainer's (docs/trainer-protocol.md).

It starts the trainer as a child process (alone, or under torchrun), streams its log into
the task log, and restarts it in place after a failure a restart can heal: no trip
through the scheduler, no new placement, which is the cheapest recovery there is. Only
when the in-place restarts are spent does the failure go to Airflow's retry (a new try,
maybe on another worker), which restores from the same checkpoints. Each failure's cause
comes from the exit code or signal (`airflow_ett.protocol.exits.classify_exit`), and
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

Preemption on request (`airflow_ett/protocol/request.py`): while the trainer runs, the
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
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypedDict

from airflow_ett._proc import ProcessTree
from airflow_ett.ett.events import AttemptEnded
from airflow_ett.jobs import attempt_id_for
from airflow_ett.operators.base import EttJobOperator, EttTrainerOperator
from airflow_ett.operators.errors import (
    TrainerConfigError,
    TrainerPreempted,
    default_retry_policy,
    failure_for,
)
from airflow_ett.operators.job import JobConfigError, JobPaths, check_train_args, reader
from airflow_ett.operators.log_progress import LogProgress, compile_pattern
from airflow_ett.operators.request_watch import REQUEST_POLL_S, RequestWatcher
from airflow_ett.operators.tracing import TRACEPARENT_ENV
from airflow_ett.protocol.env import DEFAULT_GRACE_S, GRACE_ENV, MAX_GRACE_S
from airflow_ett.protocol.request import (
    PreemptRequest,
    archive_request,
    claimed_path,
    resume_after_s,
    take_claimed,
)
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.launcher import (
    AttemptOutcome,
    Command,
    LaunchResult,
    NotStartable,
    run_attempts,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.execution_time.context import TaskStateStoreAccessor

    from airflow_ett.operators.publish import PublishedModel

__all__ = ["REQUEST_POLL_S", "CommandTrainOperator", "TorchRecTrainOperator"]

ATTEMPTS_KEY = "ett_attempts_launched"
#: A command line's length in arguments, at most (Linux's own limit is about this).
MAX_COMMAND_ARGS: Final = 4096


def check_command(where: str, command: object) -> list[str]:
    """A command line: a list of strings, the program first (non-empty), no NUL byte in
    any (the OS cannot pass one). One line naming the item otherwise."""
    r = reader(where)
    items = r.sequence("command", command, min_len=1)
    if len(items) > MAX_COMMAND_ARGS:
        raise r.fail("command", f"<{len(items)} items>", f"must have at most "
                                                         f"{MAX_COMMAND_ARGS} items")
    argv: list[str] = []
    for i, item in enumerate(items):
        arg = r.text(f"command[{i}]", item, empty=i > 0, max_len=131_072)
        if "\0" in arg:
            raise r.fail(f"command[{i}]", arg, "must not hold a NUL byte")
        argv.append(arg)
    return argv


class _StopLaunches(threading.Event):
    """`run_attempts`' stop: set (the task is being killed, or holds a request), or the
    trainer claimed a request: no restart in place after an attempt that left on it, even
    one that left before the watcher's next look saw the claim."""

    def __init__(self, job_dir: Path) -> None:
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


def _preemptions_before(job_dir: Path) -> int:
    """How many preemption requests this job has acted on (archived in its directory)."""
    return len(list(job_dir.glob("preempt_request.*.done.json")))


class TrainResult(TypedDict):
    """What a train task that succeeded returns (its XCom): the attempts of this
    execution, their exit codes, and the model when it published in the task."""

    attempts: list[str]
    exit_codes: list[int]
    published: PublishedModel | None


@dataclass(frozen=True, slots=True)
class _Run:
    """What one execution of a train task launches."""

    paths: JobPaths
    command: Command
    env: dict[str, str]
    grace_s: float
    warm_standby: bool = False
    #: our trainer's job: its files and config (publishing in the task needs them)
    trainer: TrainerConfig | None = None


class CommandTrainOperator(EttJobOperator):
    """Run any trainer command as a job's GPU task: in-place restarts first, Airflow
    retries after, preemption on request, every attempt and the job's end recorded.

    The command gets the leave protocol's environment (docs/trainer-protocol.md:
    `ETT_JOB_ID`, `ETT_ATTEMPT_ID`, `ETT_JOB_DIR`, `ETT_CHECKPOINT_DIR`, `ETT_GRACE_S`,
    `ETT_EXIT_DIR`, ...) and is judged by its exit code (0 done, 75 left on request, 78
    bad config: never retried, 70 hung, a signal: infra). A command that reports nothing
    still gets Level 1 from its attempts' boundaries and, with `progress_pattern`, from
    the step lines it prints; one that uses an adapter (`airflow_ett.adapters`) reports
    its own phases, steps and saves (Level 2) and leaves at a checkpoint when asked.

    :param command: the program and its arguments (templated), run in `cwd` (default:
        the job's directory), once per attempt; under torchrun (`--no-python`, one
        process per rank) when `nproc` > 1.
    :param restarts: in-place restarts of the command per Airflow try (0: none).
    :param grace_s: how long SIGTERM gives the command to checkpoint and leave
        (`ETT_GRACE_S`), before SIGKILL.
    :param progress_pattern: a regular expression with a named group `step` (optionally
        `cursor`, `loss`): each output line it matches is reported as that step's end.
    :param env: more environment for the command (templated).
    :param attempt_timeout_s: kill an attempt that runs longer than this; None: no limit.
    """

    ett_role = "train"
    ui_color = "#d8e8fd"
    template_fields: Sequence[str] = ("command", "env")
    #: a subclass that builds the command itself (ours) takes none from the DAG
    _builds_command: ClassVar[bool] = False

    def __init__(self, *, command: Sequence[str] | None = None, queue: str = "gpu",
                 restarts: int = 1, grace_s: float = DEFAULT_GRACE_S,
                 progress_pattern: str | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, attempt_timeout_s: float | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("retry_policy", default_retry_policy())
        super().__init__(queue=queue, **kwargs)
        where = type(self).__name__
        self.restarts, self.publish_in_task, self.attempt_timeout_s = check_train_args(
            where, restarts=restarts, publish_in_task=False,
            attempt_timeout_s=attempt_timeout_s)
        r = reader(where)
        self.command = None if self._builds_command else check_command(where, command)
        self.grace_s = r.number("grace_s", grace_s, minimum=0, maximum=MAX_GRACE_S)
        self.progress_pattern = progress_pattern
        self._pattern = compile_pattern(where, progress_pattern)
        self.env = {k: r.text(f"env[{k!r}]", v, max_len=32_768)
                    for k, v in r.mapping("env", env or {}).items()}
        self.cwd = None if cwd is None else str(r.path("cwd", cwd))
        # Run state lives in execute (Airflow deep-copies operators; a lock cannot be).
        self._proc: subprocess.Popen[str] | None = None
        self._killed: threading.Event | None = None
        self._on_kill = False  # on_kill came: a withdrawn request must not undo its stop
        self._grace_s = self.grace_s

    def plan(self, context: Context) -> _Run:
        """What this execution launches: the DAG's command with the protocol's
        environment (a subclass launches its own)."""
        paths = self.paths(context)
        try:
            paths.job_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrainerConfigError(f"work_dir = {str(paths.work_dir)!r}: cannot create the "
                                     f"job's directory {paths.job_dir}: {exc.strerror or exc}"
                                     ) from None
        assert self.command is not None  # __init__ requires one
        env = {**self.child_env(paths), GRACE_ENV: f"{self.grace_s:g}", **self.env}
        return _Run(paths, Command.of(self.command, nproc=self.nproc), env, self.grace_s)

    def execute(self, context: Context) -> TrainResult:
        ti = context["ti"]
        self._killed = threading.Event()
        self._on_kill = False
        try:
            run = self.plan(context)
        except JobConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        paths = run.paths
        self._killed = killed = _StopLaunches(paths.job_dir)
        self._grace_s = run.grace_s
        job = self.job_id(context)
        store = context.get("task_state_store")
        try_number = int(ti.try_number)
        first = first_attempt_number(self._launched_before(store), try_number, self.restarts)
        # A preemption reschedules the task in the same try: the restarts after it are
        # numbered on, so attempt ids stay unique (`<try>.<restart>`).
        offset = _preemptions_before(paths.job_dir) * (self.restarts + 1)
        hooks = _AttemptHooks(self, context, store, run.env)
        with RequestWatcher(paths.job_dir, self._yield_gpus, self._yield_at_checkpoint,
                            self._request_withdrawn) as watcher:
            try:
                result = run_attempts(
                    run.command, job, max_attempts=self.restarts + 1, first_attempt=first,
                    attempt_id=lambda n: attempt_id_for(try_number, offset + n - first + 1),
                    env=run.env, cwd=self.cwd or paths.job_dir,
                    report_unreported=hooks.ended, on_start=hooks.started,
                    on_output=hooks.lines, timeout=self.attempt_timeout_s, stop=killed,
                    warm_standby=run.warm_standby,
                )
            except NotStartable as exc:
                self.emitter(context).job_ended("failed")
                raise TrainerConfigError(str(exc)) from None
            finally:
                hooks.lines.follow(None)
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
            return self._succeeded(context, result, run)
        self._failed(context, result, last_try=try_number > int(ti.max_tries))
        raise AssertionError("unreachable")  # pragma: no cover

    def _launched_before(self, store: TaskStateStoreAccessor | None) -> int | None:
        if store is None:
            return None
        try:
            value = store.get(ATTEMPTS_KEY)
        except Exception as exc:
            self.log.warning("cannot read the attempt count: %s", exc)
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _succeeded(self, context: Context, result: LaunchResult, run: _Run) -> TrainResult:
        emitter = self.emitter(context)
        published = None
        if (self.publish_in_task and run.trainer is not None
                and isinstance(self, EttTrainerOperator)):
            from airflow_ett.operators.publish import publish_job

            with emitter.phase("publish_in_gpu"):
                published = publish_job(self, context, (run.paths, run.trainer))
        emitter.job_ended("success")
        emitter.flush()
        return {
            "attempts": [o.attempt_id for o in result.attempts],
            "exit_codes": [o.exit_code for o in result.attempts],
            "published": published,
        }

    def _failed(self, context: Context, result: LaunchResult, *,
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

    def _yield_gpus(self, request: PreemptRequest, why: str = "preemption request") -> None:
        """The controller asked this job to give its GPUs to another now (or its
        checkpoint did not come in time): no restart in place after this attempt; the
        trainer checkpoints and leaves within the grace period (or, when the request says
        `skip_save`, leaves after its current step without saving: the trainer reads
        that from the request itself)."""
        self.log.warning("preemption requested (%s): %s", why, request.reason)
        if self._killed is not None:
            self._killed.set()
        self._terminate(request.grace_s, why=why)

    def _yield_at_checkpoint(self, request: PreemptRequest) -> None:
        """Asked to yield at the next checkpoint: no restart in place after this attempt,
        and no signal: the trainer leaves by itself once that checkpoint committed."""
        self.log.warning("preemption requested at the next checkpoint (by %s at the "
                         "latest): %s", time.strftime("%H:%M:%S", time.gmtime(
                             request.leave_by)), request.reason)
        if self._killed is not None:
            self._killed.set()

    def _request_withdrawn(self, request: PreemptRequest) -> None:
        """The controller took its `at_checkpoint` request back before the trainer claimed
        it: the trainer goes on, restartable in place again (unless on_kill came)."""
        self.log.warning("preemption at checkpoint withdrawn (%s no longer waits): training "
                         "goes on", request.for_job)
        if self._killed is not None and not self._on_kill:
            self._killed.clear()

    def _after_request(self, context: Context, request: PreemptRequest,
                       result: LaunchResult, paths: JobPaths) -> None:
        """Yield (reschedule) when the trainer left preempted (exit 75, or it claimed the
        request: torchrun hides the exit 75); a request that came as the trainer ended
        anyway is put aside, and the outcome stands."""
        claimed = take_claimed(paths.job_dir, request)  # archived as done, if it is there
        if result.attempts and (result.last.exit_class.cause == "preemption"
                                or claimed is not None):
            self._rescheduled(context, request, paths, claimed)
        self.log.warning("a preemption request came as the trainer ended (%s); nothing to "
                         "yield", result.last.exit_class.description if result.attempts
                         else "not started")
        archive_request(paths.job_dir)

    def _rescheduled(self, context: Context, request: PreemptRequest, paths: JobPaths,
                     claimed: Path | None = None) -> None:
        from datetime import UTC, datetime, timedelta

        from airflow.exceptions import AirflowRescheduleException

        done = archive_request(paths.job_dir) or claimed
        self.emitter(context).flush()
        resume_s = resume_after_s(request)  # bounded: the date cannot overflow
        self.log.warning("preempted for %s: the GPUs go back to the scheduler; this task runs "
                         "again in %.0f s from its checkpoint, with no retry spent (request "
                         "kept as %s)", request.for_job, resume_s, done)
        raise AirflowRescheduleException(  # type: ignore[no-untyped-call]
            reschedule_date=datetime.now(UTC) + timedelta(seconds=resume_s))

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


class TorchRecTrainOperator(CommandTrainOperator, EttTrainerOperator):
    """Train with our TorchRec trainer: the command train task with our trainer's command
    (`python -m airflow_ett.trainer --config <job>/trainer.json`), its warm standby and
    its grace, and optionally publishing inside the task.

    :param trainer_config: the trainer's config (see `airflow_ett.trainer.config`).
    :param publish_in_task: publish the model inside this task, holding the GPUs (the
        baseline; the lifecycle default publishes in a separate CPU task).
    """

    _builds_command = True

    def __init__(self, *, publish_in_task: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.publish_in_task = reader(type(self).__name__).boolean("publish_in_task",
                                                                   publish_in_task)

    def plan(self, context: Context) -> _Run:
        paths, cfg = self.prepare(context)
        return _Run(paths, Command.trainer(paths.config_file, nproc=self.nproc),
                    self.child_env(paths), cfg.grace_s, cfg.optimizations.warm_standby, cfg)


class _AttemptHooks:
    """What the task does as each attempt starts, prints and ends unreported."""

    def __init__(self, op: CommandTrainOperator, context: Context,
                 store: TaskStateStoreAccessor | None, env: Mapping[str, str]) -> None:
        self._op, self._context, self._store = op, context, store
        self._env = env  # what each attempt's process was given (its trace context)
        self.lines = _Lines(op.log.info)

    def started(self, proc: subprocess.Popen[str], number: int, attempt: str) -> None:
        op = self._op
        op._proc = proc
        emitter = op.emitter(self._context, attempt)
        emitter.attempt_started(ts=time.time())
        if op._pattern is not None:
            self.lines.follow(LogProgress(op._pattern, emitter))
        op.log.info("attempt %s (job attempt #%d) started: pid %d", attempt, number, proc.pid)
        if self._store is not None:
            try:
                self._store.set(ATTEMPTS_KEY, number)
            except Exception as exc:  # the count is an aid, not a requirement
                op.log.warning("cannot record the attempt count: %s", exc)

    def ended(self, outcome: AttemptOutcome) -> None:
        """An attempt that did not report its own end (killed, or a command that reports
        nothing): its end from the exit code, after its last steps."""
        self.lines.follow(None)
        cls = outcome.exit_class
        emitter = self._op.emitter(self._context, outcome.attempt_id)
        emitter.attempt_ended(
            cls.status, cls.cause, exit_code=outcome.exit_code, message=cls.description,
            detected_ts=outcome.ended, ts=outcome.ended)
        self._end_attempt_span(outcome, emitter.job_id)

    def _end_attempt_span(self, outcome: AttemptOutcome, job: str | None) -> None:
        """With tracing on, the span the attempt's process never ended (it was killed, or
        reports nothing), under the id it would have used (docs/tracing.md)."""
        if job is None or TRACEPARENT_ENV not in self._env:
            return
        from airflow_ett.emit.tracing import end_unreported_attempt

        cls = outcome.exit_class
        ended = AttemptEnded(id=f"{job}.{outcome.attempt_id}.unreported", job=job,
                             ts=outcome.ended, attempt=outcome.attempt_id,
                             status=cls.status, cause=cls.cause, exit_code=outcome.exit_code,
                             message=cls.description)
        try:
            if not end_unreported_attempt({**os.environ, **self._env}, job,
                                          outcome.attempt_id, started=outcome.started,
                                          ended=ended):
                self._op.log.warning("the span of attempt %s was not exported in time",
                                     outcome.attempt_id)
        except Exception as exc:  # tracing never fails the task
            self._op.log.warning("the span of attempt %s was not made: %s",
                                 outcome.attempt_id, exc)


class _Lines:
    """The attempts' output, line by line: into the task log, and to the running
    attempt's progress reader when the task reads steps from the log."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._progress: LogProgress | None = None
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        self._log(line)
        progress = self._progress
        if progress is not None:
            progress.line(line)

    def follow(self, progress: LogProgress | None) -> None:
        """From now on feed `progress` (None: nobody), the previous one flushed."""
        with self._lock:
            previous, self._progress = self._progress, progress
        if previous is not None:
            previous.close()
