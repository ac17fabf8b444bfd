"""Run a job's attempts as child processes, restarting in place after a failure.

Restarting inside the same allocation (instead of going back through the scheduler) is
the cheapest recovery there is: no queueing, no new placement. This launcher is that
loop, shared by the Airflow train operator, the benchmarks and the tests: start the
trainer (alone or under torchrun), wait, classify how it ended, report what the child
could not report itself (a SIGKILLed process says nothing), and start the next attempt
while the failure is one a restart can heal.

An attempt is its whole process tree, not the child alone: torchrun runs each rank in a
session of its own and the trainer spawns data workers, so a timeout ends every process
of the attempt (`airflow_ett._proc`), and whatever an ended attempt leaves behind (ranks
orphaned when torchrun itself was killed, say by the OOM killer) is killed before the
next attempt starts: it would hold the GPUs the next one needs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from airflow_ett._proc import ProcessTree
from airflow_ett.ett.events import FailureCause
from airflow_ett.trainer.faults import (
    EXIT_APPLICATION,
    EXIT_BAD_CONFIG,
    EXIT_HUNG,
    EXIT_OK,
    EXIT_PREEMPTED,
)

log = logging.getLogger("airflow_ett.trainer")

# How often a running attempt's process tree is walked again, so that processes whose
# parent died (and which init adopted) are still known when the attempt ends.
TREE_POLL_S = 1.0

@dataclass(frozen=True, slots=True)
class ExitClass:
    status: Literal["success", "failed"]
    cause: FailureCause | None
    retryable: bool
    reported_by_child: bool  # whether the trainer itself emitted attempt_ended
    description: str


def classify_exit(code: int) -> ExitClass:
    """What an attempt's exit code means. Negative codes are signals (subprocess's
    convention); 128+N is a shell's or torchrun's way of saying the same."""
    if code == EXIT_OK:
        return ExitClass("success", None, False, True, "finished")
    if code == EXIT_PREEMPTED:
        return ExitClass("failed", "preemption", True, True, "preempted, checkpointed")
    if code == EXIT_BAD_CONFIG:
        return ExitClass("failed", "application", False, True,
                         "bad configuration: a retry cannot help")
    if code == EXIT_APPLICATION:
        return ExitClass("failed", "application", True, True, "the training code raised")
    if code == EXIT_HUNG:
        return ExitClass("failed", "infra", True, True,
                         "hung: no progress within hang_timeout_s, its watchdog ended it")
    signum = -code if code < 0 else code - 128 if code > 128 else None
    if signum in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        name = signal.Signals(signum).name
        return ExitClass("failed", "infra", True, False, f"killed by {name}")
    if signum == signal.SIGTERM:
        return ExitClass("failed", "preemption", True, False, "terminated (SIGTERM)")
    return ExitClass("failed", "unknown", True, False, f"exit code {code}")


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    number: int
    attempt_id: str
    exit_code: int
    exit_class: ExitClass
    started: float
    ended: float


@dataclass(slots=True)
class LaunchResult:
    attempts: list[AttemptOutcome] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].exit_code == EXIT_OK

    @property
    def last(self) -> AttemptOutcome:
        return self.attempts[-1]


Reporter = Callable[[AttemptOutcome], None]


def trainer_command(config: str | Path, *, nproc: int = 1, prewarm: bool = False,
                    python: str = sys.executable) -> list[str]:
    """The command line of one attempt: the module directly, or under torchrun."""
    args = ["-m", "airflow_ett.trainer", "--config", str(config)]
    if prewarm:
        args.append("--prewarm")
    if nproc <= 1:
        return [python, *args]
    torchrun = str(Path(python).with_name("torchrun"))
    return [torchrun, "--standalone", "--nproc-per-node", str(nproc), *args]


def _stream(proc: subprocess.Popen[str], on_output: Callable[[str], None]
            ) -> threading.Thread:
    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            # a logging problem must not stop the child's pipe draining
            with contextlib.suppress(Exception):
                on_output(line.rstrip("\n"))

    thread = threading.Thread(target=pump, name="trainer-output", daemon=True)
    thread.start()
    return thread


def _wait_attempt(proc: subprocess.Popen[Any], tree: ProcessTree,
                  timeout: float | None) -> int:
    """Wait for the attempt, walking its tree as it runs; past `timeout` SIGKILL all of it.
    Once the top process has ended, kill what is left of the tree (orphans)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    code: int | None = None
    while code is None:
        step = TREE_POLL_S if deadline is None else min(TREE_POLL_S,
                                                          deadline - time.monotonic())
        try:
            code = proc.wait(timeout=max(step, 0.0))
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                killed = tree.kill()
                log.warning("attempt ran past its timeout of %.0f s: SIGKILL to its %d "
                            "process(es) %s", timeout, len(killed), killed)
                code = proc.wait()
            else:
                tree.refresh()
    leftovers = tree.refresh()
    if leftovers:
        killed = tree.kill()
        log.warning("the attempt's top process ended (exit %d) and left %d process(es) "
                    "running: SIGKILL to %s", code, len(leftovers), killed)
        still = tree.wait(10.0)
        if still:
            log.error("processes of the attempt still run after SIGKILL: %s",
                      [p.pid for p in still])
    return code


def run_attempts(
    config: str | Path,
    job_id: str,
    *,
    max_attempts: int = 3,
    first_attempt: int = 1,
    nproc: int = 1,
    attempt_id: Callable[[int], str] = str,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    stdout: IO[str] | None = None,
    report_unreported: Reporter | None = None,
    on_start: Callable[[subprocess.Popen[str], int, str], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    timeout: float | None = None,
    extra_args: Sequence[str] = (),
    stop: threading.Event | None = None,
) -> LaunchResult:
    """Run attempts `first_attempt, first_attempt+1, ...` until one succeeds, one fails
    in a way a restart cannot heal, or `max_attempts` ran. `report_unreported` is told
    about every attempt that ended without reporting itself (killed); the caller
    records it (the operator through the emitter). `on_start(proc, number, attempt_id)`
    runs right after each launch (the operator keeps `proc` for `on_kill`);
    `on_output`, when given, receives the child's output line by line (stdout and
    stderr merged) instead of `stdout`, so a caller can stream it into its own log.
    Once `stop` is set no further attempt starts (the task is being killed)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts = {max_attempts!r}: must be >= 1")
    result = LaunchResult()
    base_env = {**os.environ, **(env or {})}
    for number in range(first_attempt, first_attempt + max_attempts):
        if stop is not None and stop.is_set():
            break
        aid = attempt_id(number)
        child_env = {**base_env, "ETT_JOB_ID": job_id, "ETT_ATTEMPT_ID": aid,
                     "ETT_ATTEMPT_NUMBER": str(number)}
        started = time.time()
        sink: IO[str] | int | None = subprocess.PIPE if on_output is not None else stdout
        proc = subprocess.Popen(
            [*trainer_command(config, nproc=nproc), *extra_args], env=child_env, cwd=cwd,
            stdout=sink, stderr=subprocess.STDOUT if sink is not None else None, text=True,
            errors="replace",
        )
        tree = ProcessTree(proc)  # before anything can signal it
        reader = _stream(proc, on_output) if on_output is not None else None
        if on_start is not None:
            on_start(proc, number, aid)
        code = _wait_attempt(proc, tree, timeout)
        if reader is not None:
            # The trainer's spawned data workers share the pipe and die with it; do not
            # let one that lingers hold the launcher up.
            reader.join(timeout=5.0)
        outcome = AttemptOutcome(number, aid, code, classify_exit(code), started, time.time())
        result.attempts.append(outcome)
        if not outcome.exit_class.reported_by_child and report_unreported is not None:
            report_unreported(outcome)
        if code == EXIT_OK or not outcome.exit_class.retryable:
            break
    return result
