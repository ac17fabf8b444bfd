"""Fault injection: how the trainer fails on purpose, at a chosen step of a chosen
attempt, to show a recovery and measure it. How it leaves when asked to, and what its
exit codes mean, is the leave protocol's (`airflow_ett/protocol/`). Imports the stdlib
alone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, get_args

log = logging.getLogger("airflow_ett.trainer")

#: `raise`: an application error; `kill`: SIGKILL (a lost host); `hang`: no progress;
#: `sigterm`: SIGTERM to itself, a preemption at a known step (the graceful path);
#: `slow_save`: the periodic save at that step blocks `seconds` longer (slow storage);
#: `slow_steps`: from that step on, each step of the rank takes `seconds` longer (a
#: straggler: a slow host or data shard; `rank_steps.py` names it).
FaultKind = Literal["raise", "kill", "hang", "sigterm", "slow_save", "slow_steps"]
#: How much longer a `slow_save` makes its save, unless the fault says (`seconds`).
SLOW_SAVE_S: Final = 20.0
FAULT_KINDS: Final[tuple[FaultKind, ...]] = get_args(FaultKind)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Inject a failure after step `at_step` completes, on attempt `attempt` only (1-based;
    None: every attempt). `raise` is an application error, `kill` a SIGKILL of the
    process (an infra failure nobody reports), `hang` stops making progress until killed,
    `sigterm` asks it to leave as a preemption does; `slow_save` makes the periodic save
    at that step block `seconds` longer (slow storage: what a save in progress looks like
    to the preemption controller), and fails nothing; `slow_steps` makes every step after
    `at_step` take `seconds` longer on its rank, before the step's compute (a straggler:
    the other ranks wait for it), and fails nothing either.

    `rank`: the one rank of a torchrun job it hits (None, the default: every rank, as a
    fault hit every rank before ranks could be named; a fault meant to show one rank's
    failure, a lost host, names it). It must be below the job's world size, which is
    known only when the trainer runs: `config.check_fault_ranks` says so there (exit 78).

    Read from the config's `faults` (`config.py`, which re-exports it); defined here so
    that this module, which imports the stdlib alone, needs nothing of the config."""

    kind: FaultKind
    at_step: int
    attempt: int | None = None
    seconds: float = SLOW_SAVE_S
    rank: int | None = None


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
        mine = [f for f in faults if (f.attempt is None or f.attempt == attempt_number)
                and (f.rank is None or f.rank == rank)]
        self._due = {f.at_step: f for f in mine if f.kind != "slow_steps"}
        #: (from the step after, seconds each step): the earliest `slow_steps` fault's
        self._slow = min(((f.at_step, f.seconds) for f in mine if f.kind == "slow_steps"),
                         default=None)
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

    def step_delay_s(self, step: int) -> float:
        """How much longer step `step` (1-based) takes on this rank (`slow_steps`), 0 if
        none; logged once, at the first slowed step."""
        if self._slow is None or step <= self._slow[0]:
            return 0.0
        if step == self._slow[0] + 1:
            log.warning("fault injection: slow_steps after step %d (attempt %d): each step "
                        "takes %.3f s longer", self._slow[0], self._attempt, self._slow[1])
        return self._slow[1]

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
