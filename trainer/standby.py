"""The warm standby: a spare trainer process, already started, that takes over a job's
next attempt the moment the running one fails.

Why: in an in-place restart most of the time to recover is a cold process (Python, torch
and torchrec imports, the model's build, the compile cache's load and the first compile),
not the checkpoint restore or the replay (bench/RESULTS.md, "Recovery"). NVIDIA's
resiliency extension restarts in process for the same reason, and torchft keeps replicas
warm. The launcher therefore starts the next attempt's process while the current one
trains (`python -m airflow_ett.trainer --standby`, at a lower CPU priority so that it
takes no cycles training needs); the spare warms up (imports, model build, compile-cache
load, compile on the synthetic fast batch) and waits on its standard input. When the
running attempt fails and is to be restarted, the launcher writes `go <unix time>` to
it; the spare becomes the next attempt, restores the newest checkpoint, starts its data
pipeline at that checkpoint's cursor and trains on; and the launcher starts a new spare
for the attempt after it. A job that ends well, or a launcher that stops, kills its
spare; a spare whose launcher died reads end-of-file and exits.

Both ends of the protocol live here: the launcher's half (`Spare`) imports nothing
heavy, since the Airflow task process runs it; the trainer's half is `stand_by` (warm
up, then wait for the go) and `WarmUp` (reported once the spare is the attempt), which
`trainer/run.py` calls.

Attribution stays honest: nothing the spare does before `go` is reported live. Its
warm-up phases are recorded here and, once it is told to go, reported clipped to the
go time: what overlapped the previous attempt's training cost the job nothing and is
not lost time (an explicit compile phase laid over training would even take that
training's place in the timeline); what the job did wait for (the spare was told to go
before its warm-up ended) is reported as the phases it was, from the go time on. The
attempt itself starts at the go time, not at the spare's process start.

Scope: one trainer process per attempt (`nproc` 1). Under torchrun the ranks of an
attempt are one world, rebuilt together, so a spare would have to be a whole spare
world; the launcher starts none there and says so once. On a GPU the spare holds its
own CUDA context and a full copy of the model and its compiled code on the same device:
turn it off (`optimizations.warm_standby = false`) for a model that does not fit twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_ett.emit import Emitter

log = logging.getLogger("airflow_ett.trainer")

#: The spare's CPU niceness (added to the launcher's): its warm-up takes what the running
#: attempt leaves, never the other way round.
STANDBY_NICE = 10

#: The standard-input line that makes a spare the next attempt.
GO = "go"

#: What a spare's output lines are prefixed with until it is told to go.
OUTPUT_PREFIX = "standby: "


class GoMessageError(ValueError):
    """The launcher's line on the spare's standard input is not `go <unix time>`."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """A phase of the spare's warm-up: name and wall-clock start and end (unix seconds)."""

    name: str
    start: float
    end: float


@dataclass(slots=True)
class PhaseRecorder:
    """Stands in for the emitter during the warm-up: `phase(name)` times the block and
    keeps it, reporting nothing (`compiling.Phases` is the protocol both satisfy)."""

    recorded: list[Recorded] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str, component: str | None = None) -> Iterator[str]:
        start = time.time()
        try:
            yield name
        finally:
            self.recorded.append(Recorded(name, start, time.time()))


def clip_to(recorded: list[Recorded], go_ts: float) -> list[Recorded]:
    """The part of each warm-up phase the job waited for: from `go_ts` on. Phases that
    ended before it vanish (they overlapped the previous attempt); one that spans it is
    cut at it. Order kept, so that nested phases stay nested."""
    return [Recorded(r.name, max(r.start, go_ts), r.end) for r in recorded if r.end > go_ts]


#: The niceness the spare started with, before `lower_priority` (None: not lowered).
_NICE_BEFORE: list[int] = []


def lower_priority() -> None:
    """Make the spare's warm-up yield the CPU to the running attempt (`STANDBY_NICE`);
    first thing in the spare's process, so that every thread it starts inherits it."""
    _NICE_BEFORE.append(os.getpriority(os.PRIO_PROCESS, 0))
    os.nice(STANDBY_NICE)


def restore_priority() -> bool:
    """Give every thread of the spare, now the attempt, its priority back. Raising a
    priority needs CAP_SYS_NICE (or an RLIMIT_NICE that allows it); without, the attempt
    keeps the spare's niceness, which is said once (docs/decisions/0018)."""
    if not _NICE_BEFORE:
        return True
    target = _NICE_BEFORE[0]
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]  # no procfs: this thread (the main one) at least
    try:
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.setpriority(os.PRIO_PROCESS, tid, target)
    except PermissionError:
        log.warning("warm standby: cannot raise this attempt's CPU priority back to nice "
                    "%d (needs CAP_SYS_NICE): it trains at nice %d", target,
                    target + STANDBY_NICE)
        return False
    return True


@dataclass(frozen=True, slots=True)
class Go:
    """The launcher's word: be the attempt from `ts` on, with `env` added to the
    environment (what the launcher decided only for the running attempt, such as where
    to signal its first step). What crosses the spare's standard input: one writer
    (`line`, by `Spare.go`), one reader (`parse_go`)."""

    ts: float
    env: dict[str, str]

    def line(self) -> str:
        return f"{GO} {self.ts!r} {json.dumps(self.env, sort_keys=True)}\n"


def parse_go(line: str) -> Go | None:
    """The go message in `line` (`go <unix time> <JSON object of strings>`), or None for
    end-of-file (an empty string: the launcher closed the pipe or died: the spare is not
    needed)."""
    if line == "":
        return None
    word, _, rest = line.strip().partition(" ")
    value, _, raw_env = rest.partition(" ")
    if word != GO:
        raise GoMessageError(f"standby: expected 'go <unix time> <env JSON>' on standard "
                             f"input, got {line.strip()[:80]!r}")
    try:
        ts = float(value)
    except ValueError:
        raise GoMessageError(f"standby: go time = {value[:40]!r}: not a number") from None
    if not math.isfinite(ts) or ts <= 0:
        raise GoMessageError(f"standby: go time = {value[:40]!r}: must be a positive unix "
                             "time")
    try:
        decoded: object = json.loads(raw_env or "{}")
    except ValueError as exc:
        raise GoMessageError(f"standby: go env = {raw_env[:80]!r}: not JSON ({exc})") from None
    items = list(decoded.items()) if isinstance(decoded, dict) else []
    env = {k: v for k, v in items if isinstance(k, str) and isinstance(v, str)}
    if not isinstance(decoded, dict) or len(env) != len(items):
        raise GoMessageError(f"standby: go env = {raw_env[:80]!r}: must be an object of "
                             "strings")
    return Go(ts, env)


def read_go(stream: IO[str]) -> Go | None:
    """Block until the launcher says go or lets the spare go (None)."""
    return parse_go(stream.readline())


class GoListener:
    """Listens for the launcher's word on its own thread from the spare's start, so that
    a go that comes while the warm-up still runs gives the spare its priority back at
    once: the job is waiting for the rest of that warm-up, which must not crawl at nice
    +10 behind other work."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._heard = threading.Event()
        self._go: Go | None = None
        self._error: GoMessageError | None = None
        self._thread = threading.Thread(target=self._listen, name="ett-standby-go",
                                         daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            self._go = read_go(self._stream)
            if self._go is not None:
                restore_priority()
        except GoMessageError as exc:
            self._error = exc
        finally:
            self._heard.set()

    def wait(self) -> Go | None:
        """The go message (None: not needed); raises GoMessageError for a bad one."""
        self._heard.wait()
        if self._error is not None:
            raise self._error
        return self._go


@dataclass(frozen=True, slots=True)
class WarmUp:
    """A spare's warm-up, once it was told to go: when, the part of its phases the job
    waited for, and the error it met, raised as the attempt's own once it is one."""

    go_ts: float
    waited: list[Recorded]  # clipped to go_ts
    error: Exception | None

    def report(self, emitter: Emitter) -> None:
        for phase in self.waited:
            span = emitter.phase_start(phase.name, ts=phase.start)
            emitter.phase_end(phase.name, span, ts=phase.end)
        if self.error is not None:
            raise self.error


def stand_by(warm_up: Callable[[PhaseRecorder], None], process_start: float,
             stream: IO[str]) -> WarmUp | None:
    """Warm up (`warm_up`: `Trainer.warm_up`), then wait for the launcher's go; None
    when it lets the spare go."""
    listener = GoListener(stream)  # a go during the warm-up restores the priority at once
    recorder = PhaseRecorder([Recorded("trainer_init", process_start, time.time())])
    error: Exception | None = None
    try:
        warm_up(recorder)
    except Exception as exc:  # the attempt's failure, if it is ever told to go
        log.exception("warm standby: warm-up failed")
        error = exc
    log.info("warm standby ready %.1f s after its start: waiting to be told to go",
             time.time() - process_start)
    go = listener.wait()
    if go is None:
        log.info("warm standby not needed: exiting")
        return None
    os.environ.update(go.env)
    return WarmUp(go.ts, clip_to(recorder.recorded, go.ts), error)


# -- the launcher's half --------------------------------------------------------------


@dataclass(slots=True)
class Spare:
    """A started spare for attempt `attempt_id`, and the thread pumping its
    output (its lines carry `OUTPUT_PREFIX` until it is told to go)."""

    proc: subprocess.Popen[str]
    attempt_id: str
    started: float
    reader: threading.Thread | None = None
    _prefix: list[str] = field(default_factory=lambda: [OUTPUT_PREFIX])

    @classmethod
    def start(cls, command: list[str], *, attempt_id: str,
              env: dict[str, str], cwd: str | None,
              on_output: Callable[[str], None] | None) -> Spare:
        """Start the spare. With `on_output` its output is pumped there line by line
        (prefixed until go); without, it shares the launcher's."""
        proc = subprocess.Popen(
            command, env=env, cwd=cwd, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if on_output is not None else None,
            stderr=subprocess.STDOUT if on_output is not None else None,
            text=True, errors="replace",
        )
        spare = cls(proc, attempt_id, time.time())
        if on_output is not None:
            spare.reader = pump_output(proc, on_output, spare._prefix)
        log.info("warm standby for attempt %s started: pid %d", attempt_id, proc.pid)
        return spare

    def go(self, ts: float, env: dict[str, str] | None = None) -> bool:
        """Make the spare the running attempt, as of `ts`, with `env` added to its
        environment. False when it is gone already (its warm-up failed, or something
        killed it): the caller starts a cold process."""
        if self.proc.poll() is not None:
            log.warning("warm standby for attempt %s ended before it was needed (exit %s): "
                        "starting a new process instead", self.attempt_id,
                        self.proc.returncode)
            self.discard()
            return False
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(Go(ts, env or {}).line())
            self.proc.stdin.close()  # nothing more to say; it reads no further
        except (BrokenPipeError, OSError) as exc:
            log.warning("warm standby for attempt %s cannot be told to go (%s): starting a "
                        "new process instead", self.attempt_id, exc)
            self.discard()
            return False
        self._prefix[0] = ""
        log.info("attempt %s taken over by its warm standby (pid %d, warm for %.1f s)",
                 self.attempt_id, self.proc.pid, ts - self.started)
        return True

    def discard(self) -> None:
        """Kill the spare and its children (data workers, compile workers) and reap it."""
        from airflow_ett._proc import ProcessTree

        if self.proc.poll() is None:
            ProcessTree(self.proc).kill()
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            log.error("warm standby pid %d did not exit after SIGKILL", self.proc.pid)
        if self.reader is not None:
            self.reader.join(timeout=5.0)


def pump_output(proc: subprocess.Popen[str], on_output: Callable[[str], None],
                prefix: list[str] | None = None) -> threading.Thread:
    """Hand `proc`'s output to `on_output` line by line, each after `prefix[0]` (a list,
    so that the prefix can change while the thread runs: a spare's, once it is told to
    go), on a daemon thread."""
    prefix = prefix if prefix is not None else [""]

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(Exception):  # logging must not stop the draining
                on_output(prefix[0] + line.rstrip("\n"))

    thread = threading.Thread(target=pump, name="trainer-output", daemon=True)
    thread.start()
    return thread
