"""Each rank's own step time: `rank_steps` events, and the probe that measures the wait.

In a synchronous job every rank's step lasts as long as the slowest's, so a rank's wall
step time cannot tell a straggler apart; its own time (the step less its wait for the
others) can (docs/decisions/0033-rank-step-times.md). The wait is measured at a **probe**:
a one-element all-reduce on a process group of its own (gloo, on the CPU: it never mixes
with the model's collectives nor the checkpoint's), just before the step's compute. Every
rank arrives there after its own part of the step (its batch, its copy to the device, any
host work since the previous step) and leaves when the last one has arrived: the time it
waited there is its wait, and the rest of its step is its own.

What the probe cannot see: a rank slow *inside* the model's collectives (a slow GPU makes
the others wait in the forward's all-to-all or the backward's all-reduce, after the probe)
shows as the same step time on every rank. On a GPU the CPU runs ahead of the device, so
the probe measures the host side there. Reporting is coalesced like progress: one event
per rank about every `span_s`, flushed at the end and before faults.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from airflow_ett.emit import Emitter

#: Seconds a rank waited at the probe; None where there is no other rank.
Probe = Callable[[], float]


def probe_group() -> Probe | None:
    """The probe of this process's job, on a gloo group of its own; None for one process.

    Call on every rank in the same order as the other `new_group` calls (a collective)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    group = dist.new_group(backend="gloo")
    token = torch.zeros(1)

    def probe() -> float:
        t = time.perf_counter()
        dist.all_reduce(token, group=group)
        return time.perf_counter() - t

    return probe


@dataclass(slots=True)
class RankClock:
    """Aggregates one rank's steps into `rank_steps` reports of about `span_s` each."""

    emitter: Emitter
    span_s: float = 10.0
    start_ts: float | None = None
    step_start: int = 0
    step_end: int = 0
    busy_s: float = 0.0
    wait_s: float = 0.0

    def add(self, step: int, t0: float, t1: float, wait_s: float) -> None:
        """Step `step` (1-based: steps `[step - 1, step)`) took `t0..t1`, `wait_s` of it
        waiting for the other ranks."""
        if self.start_ts is None:
            self.start_ts, self.step_start = t0, step - 1
            self.busy_s = self.wait_s = 0.0
        self.step_end = step
        wait = min(max(wait_s, 0.0), max(t1 - t0, 0.0))
        self.wait_s += wait
        self.busy_s += max(t1 - t0, 0.0) - wait
        if t1 - self.start_ts >= self.span_s:
            self.flush(t1)

    def flush(self, end_ts: float | None = None) -> None:
        if self.start_ts is None:
            return
        if self.step_end > self.step_start:
            self.emitter.rank_steps(self.step_start, self.step_end, self.start_ts,
                                    self.busy_s, self.wait_s,
                                    ts=time.time() if end_ts is None else end_ts)
        self.start_ts = None
