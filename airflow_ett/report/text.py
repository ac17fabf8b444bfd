"""The morning report as text (`airflow-ett report`, the nightly `report.txt`): the fleet
(or one tenant) on one day, its change from the day before, the components with their
owners and SLOs, the GPU-hours lost to slow steps inside effective training (decision
0035), failures, what-if, the worst runs; over several days, a trend table first. Built
as rich renderables through `airflow_ett.console`, the one place that meets rich: plain
text off a terminal, as README and tests read it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType

from airflow_ett.console import Column, Text, indent, table
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.report.formatting import fmt_duration, fmt_gpu_h
from airflow_ett.rollup import DayRollup, GroupFigures
from airflow_ett.rollup.components import SloStatus

TOP_WHAT_IF = 6
TOP_RUNS = 5
_STATUS_TEXT: dict[SloStatus, str] = {"ok": "ok", "breach": "BREACH", "none": "-"}


def _change(now: float | None, before: float | None) -> str:
    return "" if now is None or before is None else f" ({now - before:+.1f})"


def _pct(value: float | None) -> str:
    """ETT% or a share; `none` for a group with no GPU time (no job): never 0.0."""
    return "none" if value is None else f"{value:.1f}"


def _status_cell(status: SloStatus, terminal: bool) -> Text:
    style = {"ok": "green", "breach": "bold red", "none": ""}[status] if terminal else ""
    return Text(_STATUS_TEXT[status], style=style)


def _headline(name: str, g: GroupFigures, day: DayRollup, before: GroupFigures | None,
              terminal: bool) -> list[RenderableType]:
    line = Text.assemble(
        (f"{name} ETT% {_pct(g.ett_pct)}"
         f"{_change(g.ett_pct, before.ett_pct if before else None)}",
         "bold" if terminal else ""),
        f"   jobs {g.jobs}   GPU-h {fmt_gpu_h(g.gpu_hours)}   lost {fmt_gpu_h(g.gpu_hours_lost)}"
        f"   day {day.day} ({day.tz})")
    out: list[RenderableType] = [line]
    notes = []
    if g.provisional_jobs:
        notes.append(f"provisional: {g.provisional_jobs} job(s) still running, figures may grow")
    if day.synthetic_jobs:
        notes.append(f"synthetic data: {day.synthetic_jobs} simulated job(s) "
                     "(airflow-ett fleet simulate)")
    silent = day.silent_note()
    if silent is not None:
        notes.append(f"silent: {silent}")
    out += [Text(n, style="yellow" if terminal else "") for n in notes]
    return out


def _components(g: GroupFigures, day: DayRollup, terminal: bool) -> RenderableType:
    policies = {row.component: row for row in day.slo}
    rows = []
    for c in COMPONENTS:
        slo = policies[c]
        share = g.shares_pct[c]
        status: SloStatus = "none" if share is None else slo.policy().status(share)
        lost = "-" if c == EFFECTIVE else fmt_gpu_h(g.gpu_hours_lost_by_component.get(c, 0.0))
        rows.append((c, "none" if share is None else f"{share:.1f}%", lost, slo.owner, slo.target,
                     _status_cell(status, terminal)))
    return table(["component", Column("share", justify="right"),
                  Column("GPU-h lost", justify="right"), "owner", "SLO", "status"], rows,
                 terminal=terminal)


def slow_steps_line(g: GroupFigures) -> str:
    """Level 3 inside effective training (decision 0035): its GPU-hours and its share of
    the effective GPU time; `-` for a day stored before the figure (or no effective time)."""
    share = g.slow_steps_pct_of_effective
    return (f"slow steps: {fmt_gpu_h(g.gpu_hours_lost_to_slow_steps)} GPU-h lost inside "
            f"effective training ({'-' if share is None else f'{share:.1f}%'} of it; "
            "in ETT%, not in lost)")


def _slow_steps_most(day: DayRollup) -> str:
    """The tenant and the model that lost the most GPU-hours to slow steps, if any did."""
    out = []
    for scope, groups in (("tenant", day.tenants), ("model", day.models)):
        known = [(g.gpu_hours_lost_to_slow_steps, name) for name, g in groups.items()
                 if g.gpu_hours_lost_to_slow_steps]
        if known:
            hours, name = min(known, key=lambda x: (-x[0], x[1]))
            out.append(f"{scope} {name} {fmt_gpu_h(hours)}")
    return f"; most: {', '.join(out)}" if out else ""


def _failures(g: GroupFigures) -> list[RenderableType]:
    causes = ", ".join(f"{k} {v}" for k, v in g.nof.items() if k != "total" and v)
    return [
        Text(f"TTS p50 {fmt_duration(g.tts_p50_s)} p90 {fmt_duration(g.tts_p90_s)}   "
             f"TTR p50 {fmt_duration(g.ttr_p50_s)} p90 {fmt_duration(g.ttr_p90_s)}"),
        Text(f"failures per attempt: {g.failures_per_attempt:.3f} "
             f"({g.failures_per_attempt_without_preemption:.3f} without preemption); "
             f"NoF {g.nof['total']}" + (f" ({causes})" if causes else "")
             + f"; preemptions {g.nof['preemption']}; attempts per job {g.attempts_per_job:.2f}"),
    ]


def _fleet_extras(day: DayRollup, terminal: bool) -> list[RenderableType]:
    teams = table(["team", "components", Column("share", justify="right"),
                   Column("GPU-h lost", justify="right"), "SLO breaches"],
                  [(t.team, ", ".join(t.components),
                    "none" if t.share_pct is None else f"{t.share_pct:.1f}%",
                    fmt_gpu_h(t.gpu_hours_lost), ", ".join(t.breaches) or "-") for t in day.teams],
                  terminal=terminal)
    what_if = table(["what-if (largest gain first)", Column("fleet ETT%", justify="right"),
                     Column("gain", justify="right"), Column("GPU-h saved", justify="right")],
                    [(w.label, f"{w.ett_pct_after:.1f}", f"{w.gain_pts:+.2f}",
                      fmt_gpu_h(w.gpu_hours_saved)) for w in day.what_if[:TOP_WHAT_IF]],
                    terminal=terminal)
    return [Text(), Text("teams"), indent(teams), Text(), indent(what_if)]


def _worst_runs(day: DayRollup, tenant: str | None, terminal: bool) -> list[RenderableType]:
    runs = [r for r in day.top_runs if tenant is None or r.tenant == tenant][:TOP_RUNS]
    if not runs:
        return []
    grid = table(["worst runs", "tenant", Column("GPU-h lost", justify="right"),
                  Column("ETT%", justify="right"), "most lost in"],
                 [(r.job, r.tenant, fmt_gpu_h(r.gpu_hours_lost), f"{r.ett_pct:.1f}",
                   r.worst_component + (" (running)" if r.provisional else ""))
                  for r in runs], terminal=terminal)
    return [Text(), indent(grid)]


def day_view(day: DayRollup, before: DayRollup | None, *, tenant: str | None = None,
             terminal: bool = False) -> RenderableType:
    """One day in full, compared with `before` (the previous day) when there is one."""
    if tenant is not None:
        g = day.tenants.get(tenant)
        if g is None:
            return Text(f"tenant {tenant} ran no job on {day.day} ({day.tz})")
        prior = before.tenants.get(tenant) if before else None
        name = f"tenant {tenant}"
    else:
        g, prior, name = day.fleet, before.fleet if before else None, "fleet"
    slow = slow_steps_line(g) + (_slow_steps_most(day) if tenant is None else "")
    parts = [*_headline(name, g, day, prior, terminal), _components(g, day, terminal),
             Text(slow), *_failures(g)]
    if tenant is None:
        parts += _fleet_extras(day, terminal)
    parts += _worst_runs(day, tenant, terminal)
    return Group(*parts)


def trend_view(days: Sequence[DayRollup], *, tenant: str | None = None,
               terminal: bool = False) -> RenderableType:
    rows = []
    previous: float | None = None
    for day in days:
        g = day.tenants.get(tenant) if tenant else day.fleet
        if g is None:
            rows.append((day.day, "-", "", "0", "-", "-", "-", ""))
            continue
        note = "provisional" if g.provisional_jobs else ""
        rows.append((day.day, _pct(g.ett_pct), _change(g.ett_pct, previous).strip(" ()"),
                     str(g.jobs), fmt_gpu_h(g.gpu_hours), fmt_gpu_h(g.gpu_hours_lost),
                     fmt_gpu_h(g.gpu_hours_lost_to_slow_steps), note))
        if g.ett_pct is not None:  # a day with no job is skipped, not a change to 0
            previous = g.ett_pct
    return table(["day", Column("ETT%", justify="right"), Column("change", justify="right"),
                  Column("jobs", justify="right"), Column("GPU-h", justify="right"),
                  Column("lost", justify="right"), Column("slow steps", justify="right"),
                  ""], rows, terminal=terminal)
