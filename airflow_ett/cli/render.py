"""One job's ETT breakdown as a report, for the CLI and the demo (through `console`: plain
text off a terminal, rich's tables and colours on one).

`render_job` shows a `JobSummary` through its JSON form, the same form `--json` prints,
so whatever produced the numbers, the text says the same thing. `render_row` shows a row
read back from the store that is not a `JobSummary` this code reads (an older, laxer
version could leave an infinite or NaN time, a null, a string, a missing key): the text is
made from the JSON form for that reason, it is the one form both have. Every number is
formatted through `_num`, which shows an odd value as it is instead of raising, so one odd
stored job never keeps its report, or a page of them, from printing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType

from airflow_ett.console import Column, Text, indent, render_to_text, table
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.summary import JobSummary


def _finite(value: Any) -> float | None:
    """The value as a finite float, or None when it is not one (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _num(value: Any, spec: str) -> str:
    """`format(value, spec)` for a finite number; anything else shown raw."""
    number = _finite(value)
    if number is None:
        return "-" if value is None else str(value)
    return format(number, spec)


def _s(seconds: Any) -> str:
    number = _finite(seconds)
    if number is None:
        return "-" if seconds is None else f"{seconds} s"
    if abs(number) >= 3600:
        return f"{number / 3600:.2f} h"
    if abs(number) >= 120:
        return f"{number / 60:.1f} min"
    return f"{number:.1f} s"


def _pct(part: Any, whole: Any) -> str:
    p, w = _finite(part), _finite(whole)
    return f"{100.0 * p / w:5.1f}%" if p is not None and w is not None and w > 0 else "    -"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def render_job(summary: JobSummary, *, top_phases: int = 8, terminal: bool = False) -> str:
    return render_row(summary.to_dict(), top_phases=top_phases, terminal=terminal)


def render_row(d: Mapping[str, Any], *, top_phases: int = 8, terminal: bool = False) -> str:
    """A summary's JSON form, whatever it holds (see the module docstring), as text:
    plain unless `terminal` (then with rich's escapes and boxes)."""
    return render_to_text(job_view(d, top_phases=top_phases, terminal=terminal),
                          terminal=terminal)


def _attempt_messages(d: Mapping[str, Any]) -> list[str]:
    """`  attempt 2 failed (preemption, exit 75): <message>` for each attempt whose end
    said something (a failure's message, a preemption's reason: the controller's)."""
    out = []
    for attempt in (_dict(a) for a in _list(d.get("attempts"))):
        message = attempt.get("message")
        if not message:
            continue
        how = ", ".join(str(x) for x in (attempt.get("cause"),
                                        None if attempt.get("exit_code") is None
                                        else f"exit {attempt.get('exit_code')}") if x)
        out.append(f"  attempt {attempt.get('attempt')} {attempt.get('status')}"
                   f"{f' ({how})' if how else ''}: {message}")
    return out


def _rank_lines(ranks: Mapping[str, Any]) -> list[str]:
    """`  straggler  rank 3 of attempt 1: ...` for each straggler, then every rank's own
    step time on one line (a row written before ranks reported has none: nothing)."""
    out = []
    for s in (_dict(x) for x in _list(ranks.get("stragglers"))):
        slowdown = _num(s.get("slowdown"), ".2f")
        out.append(f"  straggler  rank {s.get('rank')} of attempt {s.get('attempt')}: "
                   f"{_num(s.get('step_s'), '.4g')} s a step of its own against "
                   f"{_num(s.get('others_step_s'), '.4g')} s for the others ({slowdown}x), "
                   f"slower in {_num(100 * (_finite(s.get('slow_share')) or 0), '.0f')}% of "
                   f"its steps; the job waited {_s(s.get('lost_s'))} for it")
    rows = [_dict(x) for x in _list(ranks.get("ranks"))]
    if rows:
        out.append("  own step per rank  " + "  ".join(
            f"{r.get('rank')}: {_num(r.get('step_s'), '.4g')} s" for r in rows))
    return out


def _heading(text: str) -> Text:
    return Text(text, style="bold cyan")


def job_view(d: Mapping[str, Any], *, top_phases: int = 8,
             terminal: bool = False) -> RenderableType:
    """The report as rich renderables, for `console.emit` (styled on a terminal).

    The title and Level 1 stay lines of text (each figure next to its label, as scripts
    and tests grep for them: "ETT% 55.08", "NoF    2"); Level 2 and Level 3 are tables.
    """
    e2e = d.get("e2e_s")
    title = f"job {d.get('job')}"
    who = " / ".join(str(x) for x in (d.get("tenant"), d.get("model")) if x)
    if who:
        title += f" ({who})"
    flags = "   [provisional: still running]" if d.get("provisional") else ""
    parts: list[RenderableType] = [
        Text.assemble((title, "bold"), "   ", (f"ETT% {_num(d.get('ett_pct'), '.2f')}",
                                                "bold green"),
                      f"   E2E {_s(e2e)}", (flags, "yellow")),
        Text(),
    ]

    nof = _dict(d.get("nof"))
    causes = ", ".join(f"{k} {v}" for k, v in nof.items() if k != "total" and v)
    rates = _dict(d.get("rates"))
    lines: list[str] = []
    tts_note = "" if d.get("started") else "  (no effective step yet)"
    lines.append(f"  TTS    {_s(d.get('tts_s'))}{tts_note}")
    for failure in (_dict(f) for f in _list(d.get("failures"))):
        where = f"attempt {failure.get('attempt')} ({failure.get('cause')})"
        if failure.get("during_tts"):
            lines.append(f"  fail   {where}: before the first effective step, inside TTS")
            continue
        stages = ", ".join(f"{k} {_s(v)}" for k, v in _dict(failure.get("stages")).items()
                           if v)
        lines.append(f"  TTR    {_s(failure.get('ttr_s'))} after {where}; from detection "
                     f"{_s(failure.get('ttr_from_detection_s'))}")
        if stages:
            lines.append(f"           {stages}")
    lines.append(f"  NoF    {nof.get('total', '-')}" + (f" ({causes})" if causes else "")
                 + f"   attempts {_num(rates.get('attempts'), '.0f')}   failures/attempt "
                 f"{_num(rates.get('failures_per_attempt'), '.2f')} "
                 f"({_num(rates.get('failures_per_attempt_without_preemption'), '.2f')} "
                 "without preemption)")
    ck = _dict(d.get("checkpoints"))
    lines.append(f"  CSBT   {_s(d.get('csbt_s'))} over {ck.get('saves', '-')} saves   shutdown "
                 f"{_s(d.get('shutdown_s'))}   in-loop waste {_s(d.get('in_loop_waste_s'))}")
    slow = _dict(d.get("slow_steps"))
    if slow:
        lines.append(f"  slow steps  {_s(slow.get('lost_s'))} of effective training "
                     f"({_num(slow.get('lost_pct_of_effective'), '.1f')}%) above the ideal step "
                     f"time {_num(slow.get('ideal_step_s'), '.4g')} s; {slow.get('slow_spans')} "
                     f"of {slow.get('spans')} progress spans slow")
    lines += _rank_lines(_dict(d.get("rank_steps")))
    if d.get("model_available_after_release_s") is not None:
        lines.append("  model available "
                     f"{_s(d['model_available_after_release_s'])} after the GPUs were released")
    parts += [_heading("Level 1"), *(Text(x) for x in lines), Text()]
    said = _attempt_messages(d)
    if said:
        parts += [_heading("Attempts' messages"), *(Text(x) for x in said), Text()]

    components = _dict(d.get("components"))
    level2 = table(
        ["component", Column("time", justify="right"), Column("share", justify="right")],
        [(c, _s(components.get(c)), _pct(components.get(c), e2e).strip()) for c in COMPONENTS],
        totals=[("total", _s(e2e), "")], terminal=terminal)
    parts += [_heading("Level 2"), indent(level2), Text()]

    def size(item: tuple[str, Any]) -> float:
        number = _finite(item[1])
        return -number if number is not None else math.inf  # odd values sort last

    phases = sorted(_dict(d.get("phases")).items(), key=size)[:top_phases]
    phase_components = _dict(d.get("phase_components"))
    level3 = table(
        ["phase", Column("time", justify="right"), Column("share", justify="right"),
         "component"],
        [(str(name), _s(value), _pct(value, e2e).strip(), str(phase_components.get(name, "?")))
         for name, value in phases], terminal=terminal)
    parts += [_heading("Level 3 (largest phases)"), indent(level3)]
    parts += [Text(f"note: {warning}", style="yellow") for warning in _list(d.get("warnings"))]
    return Group(*parts)
