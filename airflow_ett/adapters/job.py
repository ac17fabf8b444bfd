"""`job()`: any PyTorch training loop as a lifecycle job, in a `with` block.

```python
from airflow_ett.adapters import job

with job() as ett:
    with ett.phase("model_creation"):
        model = build()
    with ett.phase("checkpoint_restore"):
        step = restore(model)              # your own checkpoints, in ett.checkpoint_dir
        ett.resumed(step)
    while step < steps and not ett.should_leave:
        train_one_step(model)
        step += 1
        ett.step(step)                     # cursor defaults to the step
        if step % 50 == 0:
            with ett.checkpoint(step):     # its blocking time; a request is claimed here
                save(model, step)
    if ett.should_leave and ett.should_save:
        save(model, step)                  # SIGTERM: the exit save, within ett.grace_s
```

Leaving the block: done (exit 0); after a preemption (SIGTERM, or an `at_checkpoint`
request claimed at a save that then committed) the process exits 75; an exception is
recorded as an application failure and goes on up (exit 1); `Refused` (a bad config or
data: no retry can help) exits 78 with its one line. Every exit writes the exit record
the launcher reads (`protocol.exits`), so the task knows the trainer reported its end.

Outside a train task (no `ETT_JOB_ID`) the block runs and records nothing. The adapters
for TorchRec, Lightning and Hugging Face are thin layers over this class.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.emit.progress import ProgressSpans
from airflow_ett.ett.events import ComponentName
from airflow_ett.protocol.env import TrainerEnv, TrainerEnvError
from airflow_ett.protocol.exits import (
    EXIT_APPLICATION,
    EXIT_BAD_CONFIG,
    EXIT_OK,
    EXIT_PREEMPTED,
    exit_record,
)
from airflow_ett.protocol.leave import (
    PreemptionFlag,
    claim_at_save,
    preempted_message,
    signal_first_step,
    skip_save_request,
)
from airflow_ett.protocol.request import PreemptRequest

log = logging.getLogger("airflow_ett.adapters")

#: How long leaving waits for the emitter to deliver what was recorded.
CLOSE_TIMEOUT_S: Final = 10.0


class Refused(Exception):
    """Raise it for a mistake no retry can heal (a bad config or data file): the attempt
    ends with exit 78 and this one line, and the task does not retry."""


def _process_start() -> float:
    """When this process started, as wall-clock time, within a clock tick after it: its
    start in ticks since boot (`/proc/self/stat`) against the boot clock now. (psutil's
    `create_time` adds the boot time in whole seconds: up to a second early, before the
    launcher started it.) Elsewhere: now."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read(4096).rsplit(b")", 1)[1].split()
        # field 22, counted from the state (field 3); one tick on, so that the estimate
        # is never before the fork (the previous attempt had ended by then)
        ticks = int(fields[19]) + 1
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf(
            "SC_CLK_TCK")
        now = time.time()
        return now - since_start if 0 <= since_start < 86_400 * 365 else now
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class EttJob:
    """One attempt of a job, as a trainer reports it. Use `job()` to make one."""

    def __init__(self, env: TrainerEnv | None = None, *, emitter: Emitter | None = None
                 ) -> None:
        self._env_given, self._emitter_given = env, emitter
        self.env = env or TrainerEnv()
        self.emitter = emitter or Emitter(disabled=True)
        self.started = self.entered = time.time()
        self._spans = ProgressSpans(self.emitter)
        self._flag = PreemptionFlag()
        self._claimed: PreemptRequest | None = None
        self.left_for: PreemptRequest | None = None
        self._left_at_save = False
        self._unsaved: bool | None = None
        self._first_step = True
        self._last: tuple[int, int] = (0, 0)
        self._saved_step: int | None = None

    # -- the block ------------------------------------------------------------------------

    def __enter__(self) -> EttJob:
        try:
            self.env = self._env_given or TrainerEnv.from_environ()
        except TrainerEnvError as exc:
            print(f"airflow-ett: {exc}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_CONFIG) from None
        exit_record.start(None if self.env.exit_dir is None else str(self.env.exit_dir))
        self._flag.install()
        if self._emitter_given is None and self.env.in_job:
            sink = JsonlSink(str(self.env.events_file)) if self.env.events_file else None
            self.emitter = Emitter(self.env.job_id, self.env.attempt_id, sink=sink,
                                   replay_on_start=sink is None and self.env.is_reporter,
                                   rank=self.env.rank)
            self._spans = ProgressSpans(self.emitter)
        self.started = _process_start()
        self.emitter.attempt_started(host=socket.gethostname(), ts=self.started)
        self.entered = time.time()  # imports and set-up before the block: trainer_init
        self.record_phase("trainer_init", self.started, self.entered)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self._spans.flush()
        code = self._ended(exc)
        self.emitter.close(CLOSE_TIMEOUT_S)
        if code is None:  # not ours to report: it goes on up as it is
            if isinstance(exc, SystemExit):  # the record still says how it ended
                exit_record.exit(exc.code if isinstance(exc.code, int) else EXIT_APPLICATION)
            return False
        exit_record.exit(code, None if exc is None else f"{type(exc).__name__}: {exc}")
        if code in (EXIT_PREEMPTED, EXIT_BAD_CONFIG):
            raise SystemExit(code) from None
        return False  # done (0), or the exception goes on up (exit 1)

    def _ended(self, exc: BaseException | None) -> int | None:
        """Report how the attempt ended; its exit code (None: a SystemExit or a
        KeyboardInterrupt of the caller's own, not reported)."""
        if self.should_leave and (exc is None or isinstance(exc, SystemExit)):
            message = preempted_message(self.left_for, self.env.job_dir)
            log.warning("leaving preempted (exit 75): %s", message)
            self._report("failed", "preemption", EXIT_PREEMPTED, message)
            return EXIT_PREEMPTED
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            self._report("success", None, EXIT_OK, None)
            return EXIT_OK
        if isinstance(exc, Refused):
            print(f"airflow-ett: refused: {exc}", file=sys.stderr)
            self._report("failed", "application", EXIT_BAD_CONFIG, str(exc)[:500])
            return EXIT_BAD_CONFIG
        if isinstance(exc, Exception):
            self._report("failed", "application", EXIT_APPLICATION,
                         f"{type(exc).__name__}: {exc}"[:500])
            return EXIT_APPLICATION
        return None

    def _report(self, status: str, cause: str | None, code: int, message: str | None
                ) -> None:
        now = time.time()
        if code != EXIT_OK:
            exit_record.failed(now, message)
        exit_record.reported(cause)
        self.emitter.attempt_ended(status, cause, exit_code=code,  # type: ignore[arg-type]
                                   message=message, detected_ts=now, ts=now)

    # -- what the loop reports -----------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where to keep checkpoints (`$ETT_CHECKPOINT_DIR`, under the job's directory:
        every try of the job sees it); None outside a train task."""
        return self.env.checkpoint_dir

    @property
    def grace_s(self) -> float:
        """How long a SIGTERM leaves to save and exit."""
        return self.env.grace_s

    def phase(self, name: str, component: ComponentName | None = None
              ) -> AbstractContextManager[str]:
        """A start-up or shutdown phase (`model_creation`, `checkpoint_restore`,
        `data_pipeline_init`, `compile`, `final_checkpoint`, ...: docs/trainer-protocol.md;
        a name of your own needs its `component`)."""
        return self.emitter.phase(name, component)

    def record_phase(self, name: str, start: float, end: float,
                     component: ComponentName | None = None) -> None:
        """A phase that already happened, from `start` to `end` (a library hook saw it)."""
        span = self.emitter.phase_start(name, component, ts=start)
        self.emitter.phase_end(name, span, ts=end)

    def resumed(self, step: int, cursor: int | None = None) -> None:
        """The trainer restored `step` (the data cursor at `cursor`, default `step`)."""
        self._last = (int(step), int(step if cursor is None else cursor))
        self._saved_step = int(step)
        self._spans.resumed(*self._last)

    def begin_step(self, ts: float | None = None) -> None:
        """The next step starts now (optional: without it a step starts where the last
        ended, and the attempt's first step counts as start-up)."""
        self._spans.begin(ts)

    def step(self, step: int, cursor: int | None = None, *, loss: float | None = None,
             ts: float | None = None, startup: bool = False) -> None:
        """Step `step` (steps done, counted over the whole job) has ended; the data cursor
        is at `cursor` (default: `step`). `startup`: its time was start-up, reported as a
        phase of its own (a pipeline's first step), not as a step."""
        if self.env.is_reporter and startup:
            self._spans.resumed(step, step if cursor is None else cursor)
        elif self.env.is_reporter:
            self._spans.step(step, cursor, ts=ts, loss=loss)
        self._last = (int(step), int(step if cursor is None else cursor))
        if self._first_step:
            self._first_step = False
            if self.env.is_reporter:
                signal_first_step(self.env.first_step_file)

    @contextmanager
    def checkpoint(self, step: int | None = None, cursor: int | None = None
                   ) -> Iterator[None]:
        """Time a save (the loop is blocked for all of it) and report it once the block
        ends without error; an `at_checkpoint` preemption request is claimed as the save
        begins, and once it committed `should_leave` is True."""
        start = self.save_started()
        yield
        self.save_ended(start, step, cursor)

    def save_started(self) -> float:
        """A save begins now: claim a pending `at_checkpoint` request (rank 0). Returns
        the start time, for `save_ended`."""
        start = time.time()
        self._spans.flush()
        if self.env.is_reporter and self._claimed is None and not self._left_at_save:
            self._claimed = claim_at_save(self.env.job_dir, since=self.started)
            if self._claimed is not None:
                log.warning("preemption at checkpoint: leaving once this save has "
                            "committed (%s)", self._claimed.reason)
        return start

    def save_ended(self, start: float, step: int | None = None, cursor: int | None = None,
                   *, blocking_s: float | None = None, total_s: float | None = None,
                   final: bool = False) -> None:
        """The save begun at `start` committed: reported (`blocking_s` the loop waited,
        default all of it); a request claimed at its start makes the attempt leave."""
        now = time.time()
        step = self._last[0] if step is None else int(step)
        cursor = (self._last[1] if step == self._last[0] else step) if cursor is None \
            else int(cursor)
        held = now - start if blocking_s is None else blocking_s
        if self.env.is_reporter:
            self.emitter.checkpoint(step, cursor, start, held,
                                    now - start if total_s is None else total_s, final=final)
        self._saved_step = step
        if self._claimed is not None:
            self.left_for, self._claimed = self._claimed, None
            self._left_at_save = True

    def flush(self, timeout: float | None = None) -> bool:
        """Send what was recorded so far now, and wait (at most `timeout`) until it is
        delivered: before something that may end the process without a word."""
        self._spans.flush()
        return self.emitter.flush(timeout)

    @property
    def should_leave(self) -> bool:
        """Stop training now: SIGTERM came (save first when `should_save`), or a
        request was claimed at a save that has committed."""
        return self._left_at_save or self._flag.requested

    @property
    def should_save(self) -> bool:
        """Leaving on SIGTERM: whether to save first (the current step is not saved, and
        the pending request does not ask to leave unsaved because its save would not fit
        the grace)."""
        if self._left_at_save or not self._flag.requested:
            return False
        if self._unsaved is None:
            unsaved = skip_save_request(self.env.job_dir) if self.env.is_reporter else None
            if unsaved is not None:
                self.left_for = unsaved
            self._unsaved = unsaved is not None
        return not self._unsaved and self._saved_step != self._last[0]

    @property
    def sigterm_at(self) -> float | None:
        return self._flag.received_at


def job(env: TrainerEnv | None = None, *, emitter: Emitter | None = None) -> EttJob:
    """This process's attempt of the job the train task runs (see the module docstring).
    `env` and `emitter` default to what the task gave (`TrainerEnv.from_environ()`)."""
    return EttJob(env, emitter=emitter)


def whole(name: str, value: object, low: int) -> int:
    """An adapter's integer argument, checked: `ValueError` naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} = {value!r}: must be an integer >= {low}")
    return value
