"""How often to checkpoint: the waste a checkpoint interval costs, and the interval that
minimises it.

With interval `I`, per-save blocking time `CSBT` and mean time between failures `MTBF`,
a job that trains for `T` seconds loses

    WTT = UTT + NoS * CSBT,   UTT ~= NoF * I / 2,   NoF = T / MTBF,   NoS = T / I

(each failure loses, on average, half an interval of unsaved work). Young's first-order
optimum is `I* = sqrt(2 * CSBT * MTBF)`; Daly's higher-order form is more accurate when
saves are long compared with the failure rate. The trainer's `auto` interval and the
reports both use these functions, so the numbers a report shows are the ones the trainer
acted on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class CheckpointMathError(ValueError):
    """A bad argument, named with its value."""


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    ok = value >= 0 if allow_zero else value > 0
    if not (isinstance(value, int | float) and math.isfinite(value) and ok):
        bound = ">= 0" if allow_zero else "> 0"
        raise CheckpointMathError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def unsaved_training_time(failures: float, interval_s: float) -> float:
    """UTT: expected work lost to failures, half an interval each."""
    _positive("failures", failures, allow_zero=True)
    return failures * _positive("interval_s", interval_s) / 2.0


def wasted_training_time(
    interval_s: float, csbt_s: float, train_s: float, mtbf_s: float
) -> float:
    """WTT = UTT + NoS * CSBT for a job training `train_s` seconds."""
    interval = _positive("interval_s", interval_s)
    csbt = _positive("csbt_s", csbt_s, allow_zero=True)
    train = _positive("train_s", train_s, allow_zero=True)
    failures = train / _positive("mtbf_s", mtbf_s)
    saves = train / interval
    return unsaved_training_time(failures, interval) + saves * csbt


def young_interval(csbt_s: float, mtbf_s: float) -> float:
    """Young (1974): I* = sqrt(2 * CSBT * MTBF)."""
    return math.sqrt(2.0 * _positive("csbt_s", csbt_s) * _positive("mtbf_s", mtbf_s))


def daly_interval(csbt_s: float, mtbf_s: float) -> float:
    """Daly (2006): sqrt(2dM) * (1 + sqrt(d/2M)/3 + (d/2M)/9) - d for d < 2M, else M."""
    d = _positive("csbt_s", csbt_s)
    m = _positive("mtbf_s", mtbf_s)
    if d >= 2.0 * m:
        return m
    ratio = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - d


def estimate_mtbf(train_s: float, failures: int) -> float | None:
    """Mean time between failures from history: `train_s / failures`. With no failure
    yet the estimate is `train_s` itself, not infinity: for failures that arrive at a
    constant rate, `train_s` failure-free seconds put the MTBF at or above `train_s`
    with 63% confidence only (P(no failure in T | MTBF = T) = 1/e), so a job that has
    not failed yet is treated as one about to. The interval then starts low and grows
    with the square root of the time trained, where "infinite" would stop checkpointing
    until the first failure and lose everything trained before it. None when there is
    no history at all (nothing trained yet)."""
    train = _positive("train_s", train_s, allow_zero=True)
    if failures < 0:
        raise CheckpointMathError(f"failures must be >= 0, got {failures!r}")
    if failures == 0:
        return train if train > 0 else None
    return train / failures


#: The most of the time between two saves that a save may cost the loop: the lower bound
#: of the auto interval is the save's cost over this share (`interval_floor`).
MAX_SAVE_SHARE = 0.1


def interval_floor(cost_s: float, save_s: float = 0.0, *,
                   max_share: float = MAX_SAVE_SHARE) -> float:
    """The shortest interval worth taking for a save that costs the loop `cost_s` (its
    blocking plus the slowdown of the steps that run beside it) and takes `save_s` from
    its start to its commit: the save costs at most `max_share` of the time between
    saves, and it has committed before the next begins (one save in flight at a time).
    Set by what a save costs this job, where a fixed floor would be too long for a cheap
    save (the replay after a failure grows with it) and too short for a dear one."""
    cost = _positive("cost_s", cost_s)
    share = _positive("max_share", max_share)
    if share > 1:
        raise CheckpointMathError(f"max_share must be <= 1, got {max_share!r}")
    return max(cost / share, _positive("save_s", save_s, allow_zero=True))


@dataclass(frozen=True, slots=True)
class IntervalChoice:
    interval_s: float
    method: str  # "daly", "young"; "min"/"max" when clamped; "min" with no history (mtbf None)
    mtbf_s: float | None
    csbt_s: float


def auto_interval(
    csbt_s: float,
    train_s: float,
    failures: int,
    *,
    min_s: float,
    max_s: float = 3600.0,
    method: str = "daly",
) -> IntervalChoice:
    """The interval the trainer uses for `checkpoint_interval="auto"`: Daly's (or Young's)
    optimum from what a save costs (`csbt_s`: its blocking, plus the slowdown of the steps
    beside it where measured) and this job's failure history, clamped to `[min_s, max_s]`
    (the trainer's `min_s` is `interval_floor` of the same cost) so that a lucky history
    cannot stop checkpointing altogether. With nothing trained yet (no MTBF, or failures
    that all came before any training) it is `min_s`: the first interval measures the
    save cost, and the failure-free time that follows lengthens the interval
    (`estimate_mtbf`)."""
    lo = _positive("min_s", min_s)
    hi = _positive("max_s", max_s)
    if lo > hi:
        raise CheckpointMathError(f"min_s ({lo}) must be <= max_s ({hi})")
    if method not in ("daly", "young"):
        raise CheckpointMathError(f"method must be 'daly' or 'young', got {method!r}")
    csbt = _positive("csbt_s", csbt_s, allow_zero=True)
    mtbf = estimate_mtbf(train_s, failures)
    if mtbf is None or mtbf <= 0:
        return IntervalChoice(lo, "min", mtbf, csbt)
    if csbt == 0:
        return IntervalChoice(lo, "min", mtbf, csbt)
    best = daly_interval(csbt, mtbf) if method == "daly" else young_interval(csbt, mtbf)
    if best < lo:
        return IntervalChoice(lo, "min", mtbf, csbt)
    if best > hi:
        return IntervalChoice(hi, "max", mtbf, csbt)
    return IntervalChoice(best, method, mtbf, csbt)
