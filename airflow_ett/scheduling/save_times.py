"""Does each tenant's grace cover its jobs' checkpoint saves? (`airflow-ett tenants check`)

A victim asked to yield `now` stops after its current step, saves a whole checkpoint and
leaves; its tenant's `grace_s` bounds that, and at the end of it the job is killed. A
grace shorter than the save it must hold means the save never commits: the job loses all
its work since its previous checkpoint, the very loss preemption is meant to bound. The
grace is a guess written in a file; the saves are measured (`checkpoint_saved` events in
the ETT store), so the check compares the two.

The measure is the p90 of the whole save (`total_s`, not only the part that blocked the
train loop: an exit save has nothing to overlap with) over the tenant's non-final saves
(the final one belongs to shutdown, not to a preemption). A p90, not the mean: the grace
must hold the slow saves too, and not the single worst one, which a bad hour of storage
can make. Pure: the store is read by the CLI, which hands the seconds in.

The same saves stand in for a job that has not saved yet (`save_prior`, issue 22): the
preemption decision needs how long a job's save takes (when its announced next
checkpoint commits, what its exit save costs, how long a victim leaving at a checkpoint
holds its GPUs for the commit), and before the job's own first save its tenant's recent
saves are the best guess: the same code, storage and sizes, mostly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from airflow_ett.rollup.figures import percentile
from airflow_ett.scheduling.model import MAX_WAIT_PRICE, TenantPolicy

#: The percentile of a tenant's save times that its grace should cover.
SAVE_PCT: Final = 90.0
#: How far back a tenant's saves stand in for a job that has not saved yet (seconds): a
#: day, so that the guess follows a tenant's jobs and storage as they change.
PRIOR_WINDOW_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class SaveTime:
    """One committed non-final save as the prior needs it: `total_s` from its start to its
    commit (or the end of its background part, if later), `commit_wait_s` the part past the
    loop's blocking (what a victim leaving on that save holds its GPUs for, not training)."""

    total_s: float
    commit_wait_s: float


@dataclass(frozen=True, slots=True)
class SavePrior:
    """What a tenant's recent saves say of a save by one of its jobs that has not saved
    yet, as `live.py` says it of a job from its own saves: `typical_s` the median whole
    save (to date an announced save's commit), `exit_s` the p90 (an exit save: the
    tenant check's figure, where the job's own is the longest of its latest), and
    `commit_wait_s` the median wait past the loop's blocking part."""

    typical_s: float
    exit_s: float
    commit_wait_s: float
    saves: int


def save_prior(saves: Sequence[SaveTime]) -> SavePrior | None:
    """The prior from a tenant's recent non-final saves (None: no save to go by). Negative
    or non-finite figures (a clock step) count as 0: the guess errs short, never absurd."""
    if not saves:
        return None
    totals = [_seconds(s.total_s) for s in saves]
    waits = [min(_seconds(s.commit_wait_s), t) for s, t in zip(saves, totals, strict=True)]
    exit_s = percentile(totals, SAVE_PCT)
    assert exit_s is not None  # totals is not empty
    return SavePrior(typical_s=statistics.median(totals), exit_s=exit_s,
                     commit_wait_s=statistics.median(waits), saves=len(saves))


def _seconds(value: float) -> float:
    return value if math.isfinite(value) and value > 0 else 0.0


@dataclass(frozen=True, slots=True)
class GraceCheck:
    """One tenant's grace against its jobs' measured saves: `saves` non-final checkpoint
    saves in the window, `p90_s` the p90 of their `total_s` (None: no saves)."""

    tenant: str
    grace_s: float
    preemptible: bool
    saves: int
    p90_s: float | None

    @property
    def too_short(self) -> bool:
        """The grace is shorter than the p90 save, and it applies (the tenant can be
        preempted: a tenant that never is never uses its grace)."""
        return self.preemptible and self.p90_s is not None and self.p90_s > self.grace_s


def check_grace(tenants: Mapping[str, TenantPolicy],
                save_s: Mapping[str, Sequence[float]]) -> list[GraceCheck]:
    """Each tenant's check, in `tenants`' order; `save_s` is the `total_s` of each tenant's
    non-final saves (a tenant missing from it has none)."""
    checks = []
    for name, policy in tenants.items():
        times = save_s.get(name, ())
        checks.append(GraceCheck(tenant=name, grace_s=policy.grace_s,
                                 preemptible=policy.preemptible, saves=len(times),
                                 p90_s=percentile(times, SAVE_PCT)))
    return checks


def seconds(value: float) -> str:
    """A duration as a person reads it: `30`, `117.3`, `5400` (tenths at most: a p90 of
    117.34567 s claims a precision the measure does not have)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def grace_line(check: GraceCheck, *, days: int, wait_price: float) -> str:
    """The line `tenants check` prints for one tenant: a `warning:` when its grace is too
    short (what it costs, and the two ways out), otherwise what was compared or why
    nothing was. `wait_price` is the fleet's `[scheduling] checkpoint_wait_price`: the
    lower, the more often a victim waits for its checkpoint instead of yielding at once."""
    window = f"last {days} day{'s' if days != 1 else ''}"
    grace = f"grace_s {seconds(check.grace_s)} s"
    if check.p90_s is None:
        return (f"tenant {check.tenant}: no non-final checkpoint save of its jobs in the ETT "
                f"store ({window}): {grace} not checked")
    measured = (f"its jobs' p{SAVE_PCT:g} checkpoint save of {seconds(check.p90_s)} s "
                f"({check.saves} save{'s' if check.saves != 1 else ''}, {window})")
    if not check.preemptible:
        return (f"tenant {check.tenant}: {measured}; not preemptible, so its {grace} never "
                "applies")
    if not check.too_short:
        return f"tenant {check.tenant}: {grace} covers {measured}"
    now = f"{wait_price:g}" + (": every victim yields at once"
                               if wait_price >= MAX_WAIT_PRICE else "")
    way_out = (f"raise grace_s, or lower [scheduling] checkpoint_wait_price (now {now}), so "
               "that victims wait for their next checkpoint more often")
    return (f"warning: tenant {check.tenant}: {grace} is shorter than {measured}: a job "
            "preempted at once is killed before its checkpoint commits and loses its work "
            f"since the last one; {way_out}")
