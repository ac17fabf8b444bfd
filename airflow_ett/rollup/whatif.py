"""What-if: the fleet ETT% a team would buy by cutting its component, sorted by gain.

Two forms, both pure arithmetic on the day's job-days:

- *Cut by X%*: the component's seconds shrink by X% in every job; effective time stays, so
  fleet ETT% = effective / (E2E - X% of the component), in GPU-seconds as every fleet
  ETT% is (`figures`: each job's saving weighs by its GPUs).
- *Every start d seconds faster*: a start (scheduling, initialization, compilation) is
  repeated by every recovery, so a job gains `d` per start, `(1 + NoF) * d` for a job whose
  last attempt succeeded; counted here as `d` per attempt begun in the day, never more
  than the job's own time in the component that day (a start cannot become negative).

The gain is in ETT% points and in GPU-hours given back, so a team sees where effort pays.
A group with no GPU time has no ETT% to gain on: no what-if.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import msgspec

from airflow_ett.ett.phases import COMPILATION, COMPONENTS, EFFECTIVE, INITIALIZATION, SCHEDULING
from airflow_ett.rollup.figures import US_PER_H, US_PER_S, Totals, share_pct
from airflow_ett.rollup.job_day import JobDay

#: The components that every start (and so every recovery) goes through again.
START_COMPONENTS: Final = (SCHEDULING, INITIALIZATION, COMPILATION)


class WhatIf(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["cut", "faster_start"]
    component: str
    amount: float  # percent for "cut", seconds per start for "faster_start"
    ett_pct_before: float
    ett_pct_after: float
    gain_pts: float
    e2e_s_saved: float
    gpu_hours_saved: float

    @property
    def label(self) -> str:
        if self.kind == "cut":
            return f"cut {self.component} by {self.amount:g}%"
        return f"every start's {self.component} {self.amount:g} s faster"


def _check(cut_pct: float, start_s: float) -> None:
    if not 0 <= cut_pct <= 100:
        raise ValueError(f"cut_pct: {cut_pct!r} is not a percentage in [0, 100]")
    if not start_s >= 0:
        raise ValueError(f"start_s: {start_s!r} is not a non-negative number of seconds")


#: What each what-if cuts, in the order of `Savings.saved_us`: five cuts, three starts.
ASKED: Final[tuple[tuple[Literal["cut", "faster_start"], str], ...]] = (
    *(("cut", c) for c in COMPONENTS if c != EFFECTIVE),
    *(("faster_start", c) for c in START_COMPONENTS),
)


class Savings(msgspec.Struct, kw_only=True, gc=False):
    """What every what-if of `ASKED` saves over a group's jobs, in sums that add up
    (`merge`), as `figures.Totals` does for the figures: per job, a cut saves
    `round(us * cut_pct / 100)` of the component, a faster start `min(attempts * d, us)`;
    GPU-weighted beside. The ETT% before and after are those of the same jobs' `Totals`
    (`results`). Mutable: an accumulator (`add`, `merge`)."""

    cut_pct: float
    start_s: float
    saved_us: list[int] = msgspec.field(default_factory=lambda: [0] * len(ASKED))
    saved_gpu_us: list[int] = msgspec.field(default_factory=lambda: [0] * len(ASKED))

    def __post_init__(self) -> None:
        _check(self.cut_pct, self.start_s)
        if not len(self.saved_us) == len(self.saved_gpu_us) == len(ASKED):
            raise ValueError(f"saved_us: {len(self.saved_us)} sums; one per what-if "
                             f"({len(ASKED)}) expected")

    def add(self, d: JobDay) -> None:
        us = d.components_us
        saved, saved_gpu, gpus = self.saved_us, self.saved_gpu_us, d.gpus
        pct, per_start = self.cut_pct, round(self.start_s * US_PER_S)
        for i, (kind, c) in enumerate(ASKED):
            s = round(us[c] * pct / 100) if kind == "cut" else min(d.attempts * per_start, us[c])
            saved[i] += s
            saved_gpu[i] += s * gpus

    def merge(self, other: Savings) -> None:
        """Add `other`'s sums to these; both must ask the same amounts."""
        if (other.cut_pct, other.start_s) != (self.cut_pct, self.start_s):
            raise ValueError(f"what-if amounts: cut_pct {other.cut_pct!r} / start_s "
                             f"{other.start_s!r} differ from {self.cut_pct!r} / "
                             f"{self.start_s!r}: the sums do not add up")
        for i in range(len(ASKED)):
            self.saved_us[i] += other.saved_us[i]
            self.saved_gpu_us[i] += other.saved_gpu_us[i]

    def results(self, totals: Totals) -> list[WhatIf]:
        """Every what-if over the jobs `totals` sums (the same ones), largest gain first;
        none when they have no GPU time. ETT% in GPU-seconds: effective / (GPU time -
        the GPU time saved)."""
        gpu, effective = totals.gpu_us, totals.effective_gpu_us
        if gpu <= 0:
            return []
        before = share_pct(effective, gpu)
        rows = []
        for (kind, component), s, g in zip(ASKED, self.saved_us, self.saved_gpu_us,
                                           strict=True):
            after = share_pct(effective, gpu - g)
            rows.append(WhatIf(
                kind=kind, component=component,
                amount=self.cut_pct if kind == "cut" else self.start_s,
                ett_pct_before=before, ett_pct_after=after, gain_pts=after - before,
                e2e_s_saved=s / US_PER_S, gpu_hours_saved=g / US_PER_H))
        return sorted(rows, key=lambda w: (-w.gain_pts, w.kind, COMPONENTS.index(w.component)))


def what_ifs(days: Iterable[JobDay], *, cut_pct: float, start_s: float) -> list[WhatIf]:
    """Both forms for every component they apply to, largest gain first."""
    savings, totals = Savings(cut_pct=cut_pct, start_s=start_s), Totals()
    for d in days:
        savings.add(d)
        totals.add(d)
    return savings.results(totals)
