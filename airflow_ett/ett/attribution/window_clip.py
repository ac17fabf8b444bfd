"""After the stages: the part of one job's attribution that falls inside a time window.

A rollup over days (the nightly report) must split a job that runs across midnight by
time, not count it in both days. The window is cut from the final timeline, after
precedence has given every microsecond of `[submit, end)` exactly one label, so cutting
decides no label of its own: each microsecond lands in at most one window of a partition
of time, and the windows of such a partition add up to the whole job's components and E2E
exactly, in integer microseconds.

Guarantees: `lo` and `hi` are Unix seconds, made microseconds by `timeline.to_us` as event
times are; the window is `[lo, hi)`; a window that misses the job gives zeros (all six
components present, no phases); a window that covers `[submit, end)` gives the job's own
components and phases.

Rolling windows (`last_windows`) are the same cut, anchored at the job's end: a running
job's last 5, 15, 60 minutes (its end is then the `now` it was attributed at), for the run
page, its JSON API and the running job's gauges. Each is exactly its span long, and the
job's time in it is `min(span, E2E)`: a window longer than the job's life holds the whole
job and no more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_ett.ett.attribution.pipeline import attribute_job
from airflow_ett.ett.attribution.result import JobAttribution
from airflow_ett.ett.events import Event
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.ett.timeline import to_s, to_us


@dataclass(frozen=True, slots=True)
class WindowAttribution:
    """One job's wall time inside `[lo, hi)`. Durations are exact integer microseconds
    (`*_us`); the `*_s` properties give seconds."""

    job: str
    tenant: str
    provisional: bool  # the job still runs: its end (and this window's share) may grow
    lo: float
    hi: float
    lo_us: int
    hi_us: int
    e2e_in_window_us: int
    components_us: dict[str, int]
    phases_us: dict[str, int]

    @property
    def e2e_in_window_s(self) -> float:
        return to_s(self.e2e_in_window_us)

    @property
    def components_s(self) -> dict[str, float]:
        return {c: to_s(us) for c, us in self.components_us.items()}

    @property
    def phases_s(self) -> dict[str, float]:
        return {p: to_s(us) for p, us in self.phases_us.items()}

    @property
    def ett_pct(self) -> float:
        """Effective share of the job's time inside the window; 0 when it has none."""
        e2e = self.e2e_in_window_us
        return 100.0 * self.components_us[EFFECTIVE] / e2e if e2e > 0 else 0.0


def attribute_window(events: Iterable[Event], lo: float, hi: float,
                     now: float | None = None) -> WindowAttribution:
    """Attribute the one job `events` describe, then keep only its time inside `[lo, hi)`."""
    lo_us, hi_us = _window_us(lo, hi)  # bad bounds fail before the work, not after
    return _clip(attribute_job(events, now), lo, hi, lo_us, hi_us)


def clip_to_window(attribution: JobAttribution, lo: float, hi: float) -> WindowAttribution:
    """The part of an attribution inside `[lo, hi)`: attribute a job once, cut it into as
    many windows as a rollup needs."""
    lo_us, hi_us = _window_us(lo, hi)
    return _clip(attribution, lo, hi, lo_us, hi_us)


def last_windows(attribution: JobAttribution,
                 spans_s: Sequence[float]) -> tuple[WindowAttribution, ...]:
    """The job's last `span` seconds up to its end, for each of `spans_s`, in that order:
    `[end - span, end)` in exact microseconds. One attribution, cut as often as asked
    (attributing again per window would repeat all the stages each time)."""
    spans_us = [_span_us(s) for s in spans_s]  # bad spans fail before any cut
    end_us = to_us(attribution.ended_at)  # exact: `ended_at` is the end's microseconds / 1e6
    return tuple(_clip(attribution, to_s(end_us - span_us), to_s(end_us), end_us - span_us,
                       end_us) for span_us in spans_us)


def _span_us(span: float) -> int:
    if isinstance(span, bool) or not isinstance(span, int | float) or not math.isfinite(span):
        raise ValueError(f"a window's span must be a finite number of seconds, got {span!r}")
    span_us = to_us(span)
    if span_us <= 0:
        raise ValueError(f"a window's span must be at least a microsecond, got {span!r}")
    return span_us


def _window_us(lo: float, hi: float) -> tuple[int, int]:
    for name, value in (("lo", lo), ("hi", hi)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be Unix seconds (a number), got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite Unix seconds, got {value!r}")
    if not lo < hi:
        raise ValueError(f"hi must be after lo, got lo={lo!r} hi={hi!r}")
    return to_us(lo), to_us(hi)


def _clip(r: JobAttribution, lo: float, hi: float, lo_us: int, hi_us: int) -> WindowAttribution:
    phases_us = r.timeline.totals(lo_us, hi_us)
    components_us = dict.fromkeys(COMPONENTS, 0)
    for label, us in phases_us.items():
        components_us[r.phase_components[label]] += us
    tl = r.timeline  # it covers [submit, end) exactly once (stage 4's guarantee)
    e2e = max(0, min(hi_us, tl.ends[-1]) - max(lo_us, tl.starts[0])) if len(tl) else 0
    return WindowAttribution(
        job=r.job, tenant=r.tenant, provisional=r.provisional, lo=lo, hi=hi,
        lo_us=lo_us, hi_us=hi_us, e2e_in_window_us=e2e,
        components_us=components_us, phases_us=phases_us,
    )
