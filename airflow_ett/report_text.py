"""Plain-text rendering of one job's ETT breakdown, for the CLI and the demo.

It reads only the JSON-ready dict (`JobAttribution.to_dict()` or a cached summary from
the store), so whatever produced the numbers, the text says the same thing.
"""

from __future__ import annotations

from typing import Any

from airflow_ett.ett.phases import COMPONENTS


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.2f} h"
    if abs(seconds) >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole > 0 else "    -"


def render_job(d: dict[str, Any], *, top_phases: int = 8) -> str:
    e2e = float(d["e2e_s"])
    title = f"job {d['job']}"
    who = " / ".join(x for x in (d.get("tenant"), d.get("model")) if x)
    if who:
        title += f" ({who})"
    flags = "   [provisional: still running]" if d.get("provisional") else ""
    lines = [f"{title}   ETT% {d['ett_pct']:.2f}   E2E {_s(e2e)}{flags}", ""]

    nof = d["nof"]
    causes = ", ".join(f"{k} {v}" for k, v in nof.items() if k != "total" and v)
    rates = d["rates"]
    lines.append("Level 1")
    tts_note = "" if d.get("started") else "  (no effective step yet)"
    lines.append(f"  TTS    {_s(d['tts_s'])}{tts_note}")
    for failure in d["failures"]:
        where = f"attempt {failure['attempt']} ({failure['cause']})"
        if failure["during_tts"]:
            lines.append(f"  fail   {where}: before the first effective step, inside TTS")
            continue
        stages = ", ".join(f"{k} {_s(v)}" for k, v in failure["stages"].items() if v)
        lines.append(f"  TTR    {_s(failure['ttr_s'])} after {where}; from detection "
                     f"{_s(failure['ttr_from_detection_s'])}")
        if stages:
            lines.append(f"           {stages}")
    lines.append(f"  NoF    {nof['total']}" + (f" ({causes})" if causes else "")
                 + f"   attempts {int(rates['attempts'])}   failures/attempt "
                 f"{rates['failures_per_attempt']:.2f} "
                 f"({rates['failures_per_attempt_without_preemption']:.2f} without preemption)")
    ck = d["checkpoints"]
    lines.append(f"  CSBT   {_s(d['csbt_s'])} over {ck['saves']} saves   shutdown "
                 f"{_s(d['shutdown_s'])}   in-loop waste {_s(d['in_loop_waste_s'])}")
    if d.get("model_available_after_release_s") is not None:
        lines.append("  model available "
                     f"{_s(d['model_available_after_release_s'])} after the GPUs were released")
    lines.append("")

    lines.append("Level 2")
    lines.append(f"  {'component':<20}{'time':>12}{'share':>8}")
    for component in COMPONENTS:
        value = float(d["components"][component])
        lines.append(f"  {component:<20}{_s(value):>12}{_pct(value, e2e):>8}")
    lines.append(f"  {'total':<20}{_s(e2e):>12}")
    lines.append("")

    phases = sorted(d["phases"].items(), key=lambda kv: -kv[1])[:top_phases]
    lines.append("Level 3 (largest phases)")
    for name, value in phases:
        component = d["phase_components"].get(name, "?")
        lines.append(f"  {name:<26}{_s(value):>12}{_pct(value, e2e):>8}   {component}")
    for warning in d.get("warnings", []):
        lines.append(f"note: {warning}")
    return "\n".join(lines)
