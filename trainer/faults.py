"""Fault injection and the preemption signal: how the trainer fails on purpose, and how
it leaves gracefully when asked to.

Exit codes are the contract with whoever restarts the trainer (the Airflow operator, or
torchrun's elastic agent): they say whether a restart can help and whether it should
spend the job's failure budget.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final, Literal, get_args

if TYPE_CHECKING:  # at run time this module imports the stdlib alone (see __main__)
    from airflow_ett.trainer.config import FaultSpec

log = logging.getLogger("airflow_ett.trainer")

#: `raise`: an application error; `kill`: SIGKILL (a lost host); `hang`: no progress;
#: `sigterm`: SIGTERM to itself, a preemption at a known step (the graceful path);
#: `slow_save`: the periodic save at that step blocks `seconds` longer (slow storage).
FaultKind = Literal["raise", "kill", "hang", "sigterm", "slow_save"]
#: How much longer a `slow_save` makes its save, unless the fault says (`seconds`).
SLOW_SAVE_S: Final = 20.0
FAULT_KINDS: Final[tuple[FaultKind, ...]] = get_args(FaultKind)

EXIT_OK = 0
EXIT_APPLICATION = 1  # the training code raised: a restart may or may not help
EXIT_HUNG = 70  # EX_SOFTWARE: no progress for hang_timeout_s; the watchdog ended it
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: asked to leave (SIGTERM), checkpointed: resume for free
EXIT_BAD_CONFIG = 78  # EX_CONFIG: will not heal by retrying: fail fast


#: Where each rank of a torchrun attempt leaves its exit record (the launcher sets it, one
#: directory per attempt): `rank<R>.json` (R the global rank), read by
#: `trainer/launcher.py`. On storage every node sees, one launcher reads every node's.
EXIT_DIR_ENV: Final = "ETT_EXIT_DIR"

#: The file an attempt creates once its first step has finished (the launcher sets it
#: when it keeps a warm standby: the spare starts then, `trainer/standby.py`).
FIRST_STEP_FILE_ENV: Final = "ETT_FIRST_STEP_FILE"


class ExitRecord:
    """This rank's exit record: how it ended, for the launcher to find the root cause of a
    multi-rank attempt (`trainer/rank_failures.py` reads and judges it).

    Written as `running` when the process starts, then rewritten when it gets SIGTERM
    (`sigterm_at`) and once more when its exit path runs (`exited`, with the exit code
    and when it failed). A rank killed without warning leaves `running`: that silence is
    the record of a SIGKILL. Each write replaces the file atomically (a rename), so a
    reader sees a whole record or the previous one. Without `ETT_EXIT_DIR` (a single
    process, or a launcher that does not ask) it writes nothing; a write that fails is
    logged, never raised: the record is an aid to the launcher, not the attempt's job.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.fields: dict[str, object] = {}

    def start(self, directory: str | None = None) -> None:
        directory = directory if directory is not None else os.environ.get(EXIT_DIR_ENV)
        if not directory:
            return
        rank = os.environ.get("RANK", "0")
        if not rank.isdigit():
            log.warning("exit record: RANK=%r is not a rank: none written", rank)
            return
        self.path = Path(directory) / f"rank{int(rank)}.json"
        self.fields = {"v": 1, "state": "running", "rank": int(rank),
                       "host": socket.gethostname(), "pid": os.getpid(),
                       "started_at": time.time()}
        self._write()

    @property
    def active(self) -> bool:
        return self.path is not None

    @property
    def exited(self) -> bool:
        return self.fields.get("state") == "exited"

    def sigterm(self, at: float) -> None:
        if self.path is not None and self.fields.get("sigterm_at") is None:
            self.fields["sigterm_at"] = at
            self._write()

    def failed(self, at: float, error: str | None = None) -> None:
        """The moment this rank's failure happened (the first call wins), before its
        exit path, which may take a while (teardown, waiting for a dead peer)."""
        self.fields.setdefault("failed_at", at)
        if error is not None:
            self.fields.setdefault("error", error[:500])

    def reported(self, cause: str | None) -> None:
        """The cause this rank's own attempt_ended event gave (None: success)."""
        self.fields["reported_cause"] = cause

    def exit(self, code: int, error: str | None = None) -> None:
        if self.path is None or self.exited:
            return
        if code != 0:
            self.failed(time.time(), error)
        self.fields.update(state="exited", exit_code=code, exited_at=time.time())
        self._write()

    def _write(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.fields), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("exit record %s not written: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()


#: This process's exit record (one per process: the rank).
exit_record = ExitRecord()


def die_on_sigterm_recorded() -> None:
    """Until the trainer installs its own handler (`PreemptionFlag`), SIGTERM kills the
    process as it always did, but noted first in the exit record: torchrun SIGTERMs the
    ranks still starting when one fails, and those must not read as killed silently."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        exit_record.sigterm(time.time())
        exit_record.exit(-signal.SIGTERM, "SIGTERM before the trainer loop started")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


class InjectedFault(RuntimeError):
    """The `raise` fault: an application error at a chosen step."""


class FaultInjector:
    """Fires the configured faults for this attempt after the chosen steps complete.

    `before_fault(now)` runs first (the loop sends the progress recorded up to `now`, which
    a fault would otherwise lose); `before_kill()` runs before a SIGKILL only.
    """

    def __init__(self, faults: tuple[FaultSpec, ...], attempt_number: int, *,
                 rank: int = 0,
                 before_fault: Callable[[float], object] | None = None,
                 before_kill: Callable[[], object] | None = None) -> None:
        self._due = {f.at_step: f for f in faults
                     if (f.attempt is None or f.attempt == attempt_number)
                     and (f.rank is None or f.rank == rank)}
        self._attempt = attempt_number
        self._before_fault = before_fault
        self._before_kill = before_kill

    def save_delay_s(self, step: int) -> float:
        """How much longer the save at `step` blocks (a `slow_save` fault), 0 if none."""
        fault = self._due.get(step)
        if fault is None or fault.kind != "slow_save":
            return 0.0
        log.warning("fault injection: slow_save at step %d (attempt %d): the save blocks "
                    "%.0f s longer", step, self._attempt, fault.seconds)
        return fault.seconds

    def after_step(self, step: int, now: float) -> None:
        fault = self._due.get(step)
        if fault is None or fault.kind == "slow_save":  # that one acts in the save
            return
        if self._before_fault is not None:
            self._before_fault(now)
        log.warning("fault injection: %s after step %d (attempt %d%s)", fault.kind, step,
                    self._attempt, "" if fault.rank is None else f", rank {fault.rank}")
        if fault.kind == "raise":
            raise InjectedFault(f"injected failure after step {step} "
                                f"(attempt {self._attempt})")
        if fault.kind == "kill":
            # Give the recorder a moment so the log shows what happened up to the kill;
            # a real SIGKILL from outside can lose up to the emitter's linger of events.
            if self._before_kill is not None:
                self._before_kill()
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "sigterm":  # handled now, on this thread: the loop sees it next
            os.kill(os.getpid(), signal.SIGTERM)
        if fault.kind == "hang":
            while True:  # no progress, no exit: until someone kills us
                time.sleep(3600)


class PreemptionFlag:
    """SIGTERM (preemption, or Airflow's on_kill) sets a flag the loop polls between steps:
    finish the step, checkpoint within the grace period, exit with EXIT_PREEMPTED."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.received_at: float | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.time()
            exit_record.sigterm(self.received_at)
            log.warning("SIGTERM: finishing the current step, then checkpoint and exit")
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()
