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

Under torchrun the top process's exit code is torchrun's: 1 whenever any rank failed.
Each rank therefore leaves an exit record in a directory the launcher gives the attempt
(`ETT_EXIT_DIR`, `protocol.exits.ExitRecord`), and the attempt's class comes from the rank whose
failure the others followed (`rank_failures.root_cause`), so that the operator's
exception, its retry decision and the ETT cause all name the real cause: a SIGKILLed
rank is infra (and reported here, since it could not), a rank that raised is
application, a bad config on any rank is not retried.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Final

from airflow_ett._proc import ProcessTree
from airflow_ett._untrusted import MissingFileError, UntrustedFileError, load_json
from airflow_ett.protocol.env import EXIT_DIR_ENV, FIRST_STEP_FILE_ENV
from airflow_ett.protocol.exits import EXIT_OK, ExitClass, classify_exit
from airflow_ett.trainer.rank_failures import (
    RankOutcome,
    parse_exit_record,
    root_cause,
    tier,
)
from airflow_ett.trainer.standby import Spare, pump_output

log = logging.getLogger("airflow_ett.trainer")

# How often a running attempt's process tree is walked again, so that processes whose
# parent died (and which init adopted) are still known when the attempt ends.
TREE_POLL_S = 1.0

def classify_ranks(code: int, ranks: Sequence[RankOutcome]) -> ExitClass:
    """A torchrun attempt's class: its root-cause rank's (`rank_failures.root_cause`),
    not torchrun's exit code `code`, which says only that some rank failed. With no
    record at all (a trainer that writes none, or torchrun failed before any rank ran)
    or no rank failed, `code` is all there is. `reported_by_child` is whether rank 0
    (whose word on the attempt the ETT model takes) reported this very cause itself;
    when it did not (its peer was SIGKILLed, or another rank's failure came first), the
    launcher's caller reports the attempt's end with the root cause."""
    root = root_cause(ranks)
    if root is None:
        return classify_exit(code)
    found = tier(root)
    if found == "silent":
        base = ExitClass("failed", "infra", True, False,
                         "killed without a word (no exit record: SIGKILL, the OOM killer, "
                         "a crash)")
    elif found == "terminated":
        then = ("then killed without a word" if root.exit_code is None
                else f"exit {root.exit_code}")
        base = ExitClass("failed", "preemption", True, False, f"terminated (SIGTERM), {then}")
    else:
        assert root.exit_code is not None  # tiers bad_config and failed have one
        base = classify_exit(root.exit_code)
    leader = next((r for r in ranks if r.rank == 0), None)
    reported = leader is not None and leader.reported_cause == base.cause
    others = sum(1 for r in ranks if r.failed and r is not root)
    description = f"{root.name}: {base.description}"
    if root.error:
        description += f" ({root.error})"
    if others:
        description += f"; {others} other rank(s) failed after it"
    return ExitClass(base.status, base.cause, base.retryable, reported, description[:500])


#: An exit record is a few hundred bytes (its error text is cut to a few KB).
MAX_EXIT_RECORD_BYTES: Final = 1 << 20


def exit_records(directory: Path, world_size: int) -> list[RankOutcome]:
    """The attempt's ranks as their exit records say, one per rank; [] when no rank left
    one. A rank without a record left no word (it died before its first write, or never
    started): it reads as silent. A record that cannot be read is input from another
    process: it is logged and read as silent, never raised."""
    found: dict[int, RankOutcome] = {}
    for rank in range(world_size):
        path = directory / f"rank{rank}.json"
        try:  # bounded: a regular file, UTF-8 JSON of at most MAX_EXIT_RECORD_BYTES
            raw = load_json(path, what="exit record", max_bytes=MAX_EXIT_RECORD_BYTES)
        except MissingFileError:
            continue
        except UntrustedFileError as exc:
            log.warning("%s: rank %d counts as silent", exc, rank)
            found[rank] = RankOutcome(rank)
            continue
        try:
            found[rank] = parse_exit_record(raw, rank=rank)
        except ValueError as exc:  # ExitRecordError
            reason = exc
            log.warning("exit record %s ignored (%s): rank %d counts as silent", path,
                        reason, rank)
            found[rank] = RankOutcome(rank)
    if not found:
        return []
    return [found.get(rank, RankOutcome(rank)) for rank in range(world_size)]


@contextlib.contextmanager
def _attempt_dir(wanted: bool, prefix: str) -> Iterator[Path | None]:
    """A fresh directory of the launcher's own (mode 0700) for one attempt, removed
    afterwards; None when not `wanted`. Two kinds: the ranks' exit records of a torchrun
    attempt (`ett-exits-`; a single process's exit code says it all), and the file the
    running attempt signals its first step with when a warm spare is wanted
    (`ett-attempt-`)."""
    if not wanted:
        yield None
        return
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    number: int
    attempt_id: str
    exit_code: int
    exit_class: ExitClass
    started: float
    ended: float
    #: Under torchrun: every rank's outcome, from the exit records ([] otherwise).
    ranks: tuple[RankOutcome, ...] = ()


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


class NotStartable(ValueError):
    """An attempt's program cannot be started at all (missing, not executable): no
    attempt ran, and no retry can help on this worker; the message names the program."""


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """How the torchrun agents of a multi-node job find each other (c10d rendezvous):
    `nnodes` agents, each started with `nproc` ranks, meet at `endpoint` (`host:port`,
    served by the agent on that host) under the id `run_id` (one per attempt, the same on
    every node). docs/multi-node.md says who starts the other nodes' agents."""

    nnodes: int
    endpoint: str
    run_id: str

    def __post_init__(self) -> None:
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or self.nnodes < 2:
            raise ValueError(f"nnodes = {self.nnodes!r}: must be an integer >= 2 (one node "
                             "needs no rendezvous endpoint: --standalone)")
        host, sep, port = self.endpoint.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"rdzv_endpoint = {self.endpoint!r}: must be host:port (the "
                             "node whose agent hosts the rendezvous, a port in 1..65535)")
        if not self.run_id or not all(c.isalnum() or c in "-_." for c in self.run_id):
            raise ValueError(f"rdzv_id = {self.run_id!r}: must be a non-empty id of "
                             "letters, digits, '-', '_' and '.'")

    def args(self) -> list[str]:
        return ["--nnodes", str(self.nnodes), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", self.endpoint, "--rdzv-id", self.run_id]


def trainer_command(config: str | Path, *, nproc: int = 1, prewarm: bool = False,
                    standby: bool = False, python: str = sys.executable,
                    rendezvous: Rendezvous | None = None) -> list[str]:
    """The command line of one attempt: the module directly, or under torchrun (on one
    node, `--standalone`; on several, this node's agent of `rendezvous`). `standby`: a
    warm spare for the next attempt (one process only; `trainer/standby.py`)."""
    args = ["-m", "airflow_ett.trainer", "--config", str(config)]
    if prewarm:
        args.append("--prewarm")
    if standby:
        if nproc > 1 or rendezvous is not None:
            raise ValueError("a warm standby is one process: not under torchrun")
        args.append("--standby")
    if nproc <= 1 and rendezvous is None:
        return [python, *args]
    torchrun = str(Path(python).with_name("torchrun"))
    where = rendezvous.args() if rendezvous is not None else ["--standalone"]
    return [torchrun, *where, "--nproc-per-node", str(nproc), *args]


@dataclass(frozen=True, slots=True)
class Command:
    """What each attempt runs: `argv` (already under torchrun when `nproc` > 1), and a
    warm spare's command line when the trainer can be one (`standby_argv`, ours only).
    `records`: the trainer may or may not speak the protocol (any command): every attempt
    gets an exit-record directory, even a single process, and an end counts as reported
    by the trainer only when rank 0's record says it reported it; otherwise the
    launcher's caller reports it (a command that writes nothing still gets its
    attempts' ends recorded, from its exit code)."""

    argv: tuple[str, ...]
    nproc: int = 1
    standby_argv: tuple[str, ...] | None = None
    records: bool = False

    @classmethod
    def trainer(cls, config: str | Path, *, nproc: int = 1, extra_args: Sequence[str] = (),
                python: str = sys.executable) -> Command:
        """Our trainer on `config` (`trainer_command`), with its warm spare's line."""
        return cls(tuple([*trainer_command(config, nproc=nproc, python=python),
                          *extra_args]), nproc,
                   tuple([*trainer_command(config, standby=True, python=python),
                          *extra_args]))

    @classmethod
    def of(cls, argv: Sequence[str], *, nproc: int = 1, python: str = sys.executable
           ) -> Command:
        """A command of any kind: alone, or each rank under torchrun (`--no-python`: the command is
        run as given, one process per rank, with torchrun's RANK, WORLD_SIZE, ...)."""
        if not argv:
            raise ValueError("command: must name a program")
        if nproc <= 1:
            return cls(tuple(argv), 1, None, True)
        torchrun = str(Path(python).with_name("torchrun"))
        return cls((torchrun, "--standalone", "--nproc-per-node", str(nproc), "--no-python",
                    *argv), nproc, None, True)


def _wait_attempt(proc: subprocess.Popen[str], tree: ProcessTree,
                  timeout: float | None, tick: Callable[[], None] | None = None) -> int:
    """Wait for the attempt, walking its tree as it runs (and calling `tick`) every
    `TREE_POLL_S`; past `timeout` SIGKILL all of it. Once the top process has ended, kill
    what is left of the tree (orphans)."""
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
                if tick is not None:
                    tick()
    leftovers = tree.refresh()
    if leftovers:
        killed = tree.kill()
        # processes on their way out (a worker that saw its parent go) are not news
        (log.warning if killed else log.debug)(
            "the attempt's top process ended (exit %d) and left %d process(es) running: "
            "SIGKILL to %s", code, len(leftovers), killed)
        still = tree.wait(10.0)
        if still:
            log.error("processes of the attempt still run after SIGKILL: %s",
                      [p.pid for p in still])
    return code


def run_attempts(
    config: str | Path | Command,
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
    warm_standby: bool = False,
) -> LaunchResult:
    """Run attempts `first_attempt, first_attempt+1, ...` until one succeeds, one fails
    in a way a restart cannot heal, or `max_attempts` ran. `report_unreported` is told
    about every attempt that ended without reporting itself (killed); the caller
    records it (the operator through the emitter). `on_start(proc, number, attempt_id)`
    runs right after each launch (the operator keeps `proc` for `on_kill`);
    `on_output`, when given, receives the child's output line by line (stdout and
    stderr merged) instead of `stdout`, so a caller can stream it into its own log.
    Once `stop` is set no further attempt starts (the task is being killed).

    With `warm_standby` (one process per attempt only: `trainer/standby.py` says why),
    while an attempt runs the next one's process is started and warmed up beside it; a
    restart then hands over to it instead of starting a cold process.

    `config`: our trainer's config file (run as `Command.trainer`), or any `Command`
    (then `nproc` and `extra_args` are the command's own)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts = {max_attempts!r}: must be >= 1")
    command = config if isinstance(config, Command) else Command.trainer(
        config, nproc=nproc, extra_args=extra_args)
    launch = _Launch(command, job_id, attempt_id, {**os.environ, **(env or {})},
                     cwd, stdout, on_start, on_output, timeout,
                     warm_standby and command.standby_argv is not None,
                     first_attempt + max_attempts - 1)
    result = LaunchResult()
    try:
        for number in range(first_attempt, first_attempt + max_attempts):
            if stop is not None and stop.is_set():
                break
            outcome = launch.attempt(number)
            result.attempts.append(outcome)
            if not outcome.exit_class.reported_by_child and report_unreported is not None:
                report_unreported(outcome)
            if outcome.exit_code == EXIT_OK or not outcome.exit_class.retryable:
                break
    finally:
        launch.discard_spare()
    return result


@dataclass(slots=True)
class _Launch:
    """What every attempt of one `run_attempts` call is started with, and the warm spare
    waiting to be the next one (`trainer/standby.py`)."""

    command: Command
    job_id: str
    attempt_id: Callable[[int], str]
    base_env: dict[str, str]
    cwd: str | Path | None
    stdout: IO[str] | None
    on_start: Callable[[subprocess.Popen[str], int, str], None] | None
    on_output: Callable[[str], None] | None
    timeout: float | None
    warm_standby: bool
    last: int
    spare: Spare | None = None

    def __post_init__(self) -> None:
        if self.warm_standby and self.nproc > 1:
            log.info("no warm standby under torchrun (nproc %d): a spare would have to be "
                     "a whole spare world; restarts start cold", self.nproc)
            self.warm_standby = False

    @property
    def nproc(self) -> int:
        return self.command.nproc

    def attempt(self, number: int) -> AttemptOutcome:
        """Start attempt `number` (on the spare, if one is warm), start the next one's
        spare beside it, wait for it to end, classify how it ended."""
        aid = self.attempt_id(number)
        env = _attempt_env(self.base_env, self.job_id, aid, number)
        started = time.time()
        with _attempt_dir(self.nproc > 1 or self.command.records, "ett-exits-") as exits, \
                _attempt_dir(self._wants_spare(number), "ett-attempt-") as sig:
            if exits is not None:
                env[EXIT_DIR_ENV] = str(exits)
            if sig is not None:
                env[FIRST_STEP_FILE_ENV] = str(sig / "first-step")
            spare, self.spare = self.spare, None
            proc, tree, reader = _launch(self.command.argv, env, self.cwd, self.stdout,
                                         self.on_output, spare, started)
            if self.on_start is not None:
                self.on_start(proc, number, aid)
            tick = None
            if sig is not None:
                tick = functools.partial(self._spare_once_training, number + 1,
                                         sig / "first-step")
            code = _wait_attempt(proc, tree, self.timeout, tick)
            if reader is not None:
                # The trainer's spawned data workers share the pipe and die with it; do
                # not let one that lingers hold the launcher up.
                reader.join(timeout=5.0)
            ranks = exit_records(exits, self.nproc) if exits is not None else []
        # torchrun itself killed (a signal: the timeout, the OOM killer) says it all
        exit_class = classify_ranks(code, ranks) if 0 < code < 128 else classify_exit(code)
        if self.command.records:
            exit_class = _as_reported(exit_class, ranks)
        return AttemptOutcome(number, aid, code, exit_class, started, time.time(),
                              tuple(ranks))

    def _wants_spare(self, number: int) -> bool:
        return self.warm_standby and number < self.last

    def _spare_once_training(self, number: int, first_step: Path) -> None:
        """Start the next attempt's spare once the running one has finished its first
        step: not before, so that the spare's warm-up does not compete with the running
        attempt's own start (TTS) for the CPU."""
        if self.spare is None and first_step.exists():
            self.spare = self._start_spare(number)

    def _start_spare(self, number: int) -> Spare:
        aid = self.attempt_id(number)
        output = self.on_output
        if output is None and self.stdout is not None:
            output = _writer(self.stdout)
        assert self.command.standby_argv is not None  # warm_standby says there is one
        return Spare.start(
            list(self.command.standby_argv),
            attempt_id=aid,
            env=_attempt_env(self.base_env, self.job_id, aid, number),
            cwd=None if self.cwd is None else str(self.cwd), on_output=output)

    def discard_spare(self) -> None:
        if self.spare is not None:
            self.spare.discard()
            self.spare = None


def _attempt_env(base_env: dict[str, str], job_id: str, aid: str, number: int
                 ) -> dict[str, str]:
    return {**base_env, "ETT_JOB_ID": job_id, "ETT_ATTEMPT_ID": aid,
            "ETT_ATTEMPT_NUMBER": str(number)}


def _writer(stream: IO[str]) -> Callable[[str], None]:
    def write(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return write


def _as_reported(exit_class: ExitClass, ranks: Sequence[RankOutcome]) -> ExitClass:
    """A command's attempt counts as reported by the trainer only when rank 0's exit
    record says it reported this very end itself (a trainer that writes no record, or
    reported another cause, did not: the launcher's caller reports it)."""
    leader = next((r for r in ranks if r.rank == 0), None)
    reported = (leader is not None and leader.reported
                and leader.reported_cause == exit_class.cause)
    return replace(exit_class, reported_by_child=reported)


def _launch(argv: Sequence[str],
            child_env: dict[str, str], cwd: str | Path | None, stdout: IO[str] | None,
            on_output: Callable[[str], None] | None, spare: Spare | None, now: float
            ) -> tuple[subprocess.Popen[str], ProcessTree, threading.Thread | None]:
    """The attempt's process: the warm spare told to go, when there is one that can, else
    a new one; with the thread streaming its output, if any."""
    handed = {k: v for k, v in child_env.items() if k == FIRST_STEP_FILE_ENV}
    if spare is not None and spare.go(now, handed):
        return spare.proc, ProcessTree(spare.proc), spare.reader
    sink: IO[str] | int | None = subprocess.PIPE if on_output is not None else stdout
    try:
        proc = subprocess.Popen(
            list(argv), env=child_env, cwd=cwd,
            stdout=sink, stderr=subprocess.STDOUT if sink is not None else None, text=True,
            errors="replace",
        )
    except OSError as exc:  # no such program, not executable, no such cwd
        raise NotStartable(f"command {argv[0]!r}: cannot start it here: "
                           f"{exc.strerror or exc}") from None
    tree = ProcessTree(proc)  # before anything can signal it
    reader = pump_output(proc, on_output) if on_output is not None else None
    return proc, tree, reader
