"""What-if: the fleet ETT% a team would buy by cutting its component, sorted by gain.

Two forms, both pure arithmetic on the day's job-days:

- *Cut by X%*: the component's seconds shrink by X% in every job; effective time stays, so
  fleet ETT% = effective / (E2E - X% of the component).
- *Every start d seconds faster*: a start (scheduling, initialization, compilation) is
  repeated by every recovery, so a job gains `d` per start, `(1 + NoF) * d` for a job whose
  last attempt succeeded; counted here as `d` per attempt begun in the day, never more
  than the job's own time in the component that day (a start cannot become negative).

The gain is in ETT% points and in GPU-hours given back, so a team sees where effort pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from airflow_ett.ett.phases import COMPILATION, COMPONENTS, EFFECTIVE, INITIALIZATION, SCHEDULING
from airflow_ett.rollup.figures import US_PER_H, US_PER_S, share_pct
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


def _result(kind: Literal["cut", "faster_start"], component: str, amount: float,
            days: Sequence[JobDay], saved_us: list[int]) -> WhatIf:
    e2e = sum(d.e2e_us for d in days)
    effective = sum(d.effective_us for d in days)
    saved = sum(saved_us)
    before = share_pct(effective, e2e)
    after = share_pct(effective, e2e - saved)
    return WhatIf(kind=kind, component=component, amount=amount, ett_pct_before=before,
                  ett_pct_after=after, gain_pts=after - before, e2e_s_saved=saved / US_PER_S,
                  gpu_hours_saved=sum(s * d.gpus for s, d in zip(saved_us, days, strict=True))
                  / US_PER_H)


def cut(days: Sequence[JobDay], component: str, pct: float) -> WhatIf:
    if component not in COMPONENTS or component == EFFECTIVE:
        raise ValueError(f"component: {component!r} is not a component of lost time")
    if not 0 <= pct <= 100:
        raise ValueError(f"cut_pct: {pct!r} is not a percentage in [0, 100]")
    saved = [round(d.components_us[component] * pct / 100) for d in days]
    return _result("cut", component, pct, days, saved)


def faster_start(days: Sequence[JobDay], component: str, seconds: float) -> WhatIf:
    if component not in START_COMPONENTS:
        raise ValueError(f"component: {component!r} is not repeated by every start "
                         f"(one of {', '.join(START_COMPONENTS)})")
    if not seconds >= 0:
        raise ValueError(f"start_s: {seconds!r} is not a non-negative number of seconds")
    per_start = round(seconds * US_PER_S)
    saved = [min(d.attempts * per_start, d.components_us[component]) for d in days]
    return _result("faster_start", component, seconds, days, saved)


def what_ifs(days: Sequence[JobDay], *, cut_pct: float, start_s: float) -> list[WhatIf]:
    """Both forms for every component they apply to, largest gain first."""
    rows = [cut(days, c, cut_pct) for c in COMPONENTS if c != EFFECTIVE]
    rows += [faster_start(days, c, start_s) for c in START_COMPONENTS]
    return sorted(rows, key=lambda w: (-w.gain_pts, w.kind, COMPONENTS.index(w.component)))
