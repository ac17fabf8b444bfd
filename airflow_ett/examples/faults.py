"""The example trainers' command line, and their injected failures:
`--fail KIND@STEP[@ATTEMPT]`.

The examples are trainers a user writes; a fault is how a demo or a test makes one fail
on purpose, at a known step of a known job attempt (`$ETT_ATTEMPT_NUMBER`, default 1):
`raise` (an application error: exit 1), `kill` (SIGKILL: a lost host), `sigterm` (as a
`now` preemption does), `refuse` (a config error: exit 78, never retried).
"""

from __future__ import annotations

import argparse
import os
import signal
from dataclasses import dataclass
from typing import Final

from airflow_ett.adapters.job import EttJob, Refused

KINDS: Final = ("raise", "kill", "sigterm", "refuse")


class InjectedFailure(RuntimeError):
    """The `raise` fault."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    step: int
    attempt: int = 1

    def due(self, step: int) -> bool:
        attempt = int(os.environ.get("ETT_ATTEMPT_NUMBER", "1") or 1)
        return step == self.step and attempt == self.attempt

    def fire(self, job: EttJob | None = None) -> None:
        if self.kind == "raise":
            raise InjectedFailure(f"injected failure after step {self.step}")
        if self.kind == "refuse":
            raise Refused(f"injected config error after step {self.step}")
        if self.kind == "kill":
            # what was recorded up to the kill is delivered first (as our trainer's fault
            # injection does): a real SIGKILL loses up to the emitter's linger of it
            if job is not None:
                job.flush(5.0)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)


def parse_fault(text: str) -> Fault:
    """`KIND@STEP[@ATTEMPT]`, for argparse (its error names the argument)."""
    parts = text.split("@")
    if len(parts) not in (2, 3) or parts[0] not in KINDS or not all(
            p.isdigit() and int(p) >= 1 for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be KIND@STEP[@ATTEMPT], KIND one of {list(KINDS)}, STEP and "
            "ATTEMPT whole numbers >= 1")
    return Fault(parts[0], *(int(p) for p in parts[1:]))


def check(faults: list[Fault], step: int, job: EttJob | None = None) -> None:
    """Fire the faults due after `step` (of this attempt)."""
    for fault in faults:
        if fault.due(step):
            fault.fire(job)


def parser(description: str | None) -> argparse.ArgumentParser:
    """The example trainers' command line: steps, the save cadence, where checkpoints go,
    a step's padding, and injected failures."""
    out = argparse.ArgumentParser(description=description)
    out.add_argument("--steps", type=int, default=40)
    out.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    out.add_argument("--dir", default=None, help="checkpoints (default: the job's)")
    out.add_argument("--step-sleep", type=float, default=0.0,
                     help="seconds added to each step (a heavier model's, on a laptop)")
    out.add_argument("--fail", type=parse_fault, action="append", default=[],
                     metavar="KIND@STEP[@ATTEMPT]", help="inject a failure (repeatable)")
    return out
