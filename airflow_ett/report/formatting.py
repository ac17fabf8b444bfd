"""How every report shows a number (text, HTML, the UI pages), so that one figure reads the
same everywhere: ETT% and shares with one decimal, changes signed, GPU-hours whole with
separators from 100 up, durations in s / min / h; `-` for a value that is missing or not
finite."""

from __future__ import annotations

import math


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def fmt_pct(value: float | None) -> str:
    """ETT% and shares: one decimal, `-` for none (as the text report)."""
    v = _finite(value)
    return "-" if v is None else f"{v:.1f}"


def fmt_delta(value: float | None) -> str:
    v = _finite(value)
    return "-" if v is None else f"{v:+.1f}"


def fmt_gpu_h(value: float | None) -> str:
    """GPU-hours: whole hours with separators from 100 up (`18,430`); below, the two
    decimals a small fleet needs to show anything (`12.34`, `0.28`). As report/text.py."""
    v = _finite(value)
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def fmt_duration(seconds: float | None) -> str:
    v = _finite(seconds)
    if v is None:
        return "-"
    if abs(v) >= 3600:
        return f"{v / 3600:.2f} h"
    if abs(v) >= 120:
        return f"{v / 60:.1f} min"
    return f"{v:.1f} s"


def fmt_step(seconds: float | None) -> str:
    """A step time: milliseconds below a second (`42.5 ms`), else seconds (`1.25 s`)."""
    v = _finite(seconds)
    if v is None:
        return "-"
    return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"


def fmt_slow_steps(gpu_hours: float | None, pct_of_effective: float | None) -> str:
    """GPU-hours lost to slow steps and their share of the effective GPU time (decision
    0035): `12.34 (3.1%)`; the hours alone without effective time; `-` for a day stored
    before the figure."""
    hours = fmt_gpu_h(gpu_hours)
    if hours == "-":
        return hours
    share = _finite(pct_of_effective)
    return hours if share is None else f"{hours} ({share:.1f}%)"
