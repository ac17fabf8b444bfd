"""A regression explained, as text (`airflow-ett report --compare A B`): fleet ETT% in two
windows, what moved it ranked by size (components, tenants, models), for the fleet as
operated and for the fixed cohort of models that ran in both, and the models that entered,
left or changed platform. The figures are `rollup.compare`'s; JSON is its `to_dict`.
Built through `airflow_ett.console` as the morning report is: plain text off a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType

from airflow_ett.console import Column, Text, indent, render_to_text, table
from airflow_ett.report.formatting import fmt_gpu_h, fmt_pct
from airflow_ett.rollup.compare import Comparison, GroupMove, ModelChange, View

#: Tenants and models shown per view (the largest contributions); JSON has them all.
TOP: int = 10


def _pts(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _headline(name: str, view: View, terminal: bool) -> RenderableType:
    b, a = view.before, view.after
    return Text.assemble(
        (f"{name} ETT% {fmt_pct(b.ett_pct)} -> {fmt_pct(a.ett_pct)} "
         f"({_pts(view.change_points)} points)", "bold" if terminal else ""),
        f"   GPU-h {fmt_gpu_h(b.gpu_hours)} -> {fmt_gpu_h(a.gpu_hours)}"
        f"   lost {fmt_gpu_h(b.gpu_hours_lost)} -> {fmt_gpu_h(a.gpu_hours_lost)}"
        f"   models {b.models} -> {a.models}")


def _components(view: View, terminal: bool) -> RenderableType:
    rows = [(m.component, _pct(m.before_pct), _pct(m.after_pct), _pts(m.ett_points))
            for m in view.components]
    return table(["component (lost share)", Column("before", justify="right"),
                  Column("after", justify="right"), Column("ETT% points", justify="right")],
                 rows, terminal=terminal,
                 totals=[("ETT% change", "", "", _pts(view.change_points))])


def _groups(scope: str, moves: Sequence[GroupMove], change: float | None, top: int,
            terminal: bool) -> list[RenderableType]:
    if not moves:
        return []
    rows = [(g.name, _pts(g.points), _pts(g.rate_points), _pts(g.mix_points),
             fmt_pct(g.before_pct), fmt_pct(g.after_pct), fmt_gpu_h(g.gpu_hours_before),
             fmt_gpu_h(g.gpu_hours_after)) for g in moves[:top]]
    rest = moves[top:]
    if rest:
        rows.append((f"({len(rest)} more)", _pts(sum(g.points for g in rest)),
                     _pts(sum(g.rate_points for g in rest)),
                     _pts(sum(g.mix_points for g in rest)), "", "", "", ""))
    grid = table([scope, Column("points", justify="right"), Column("rate", justify="right"),
                  Column("mix", justify="right"), Column("ETT% before", justify="right"),
                  Column("after", justify="right"), Column("GPU-h before", justify="right"),
                  Column("after", justify="right")], rows, terminal=terminal,
                 totals=[("ETT% change", _pts(change), "", "", "", "", "", "")])
    return [Text(), grid]


def _view(title: str, view: View, top: int, terminal: bool) -> RenderableType:
    body: list[RenderableType] = [_components(view, terminal)]
    body += _groups("tenant", view.tenants, view.change_points, top, terminal)
    body += _groups("model", view.models, view.change_points, top, terminal)
    return Group(Text(title, style="bold" if terminal else ""), indent(Group(*body)))


def _gpus(gpus: list[int] | None) -> str:
    if gpus is None:
        return "?"
    return ",".join(str(g) for g in gpus) or "-"


def _changes(c: Comparison, top: int, terminal: bool) -> list[RenderableType]:
    changes: list[ModelChange] = [*c.entered, *c.left, *c.platform_changed]
    if not changes:
        return [Text("no model entered, left or changed platform (GPUs per job)")]
    shown = [*c.entered[:top], *c.left[:top], *c.platform_changed[:top]]
    rows = [(m.model, m.change, ", ".join(m.tenants), f"{_gpus(m.gpus_before)} -> "
             f"{_gpus(m.gpus_after)}", fmt_pct(m.before_pct), fmt_pct(m.after_pct),
             fmt_gpu_h(m.gpu_hours_before), fmt_gpu_h(m.gpu_hours_after), _pts(m.points))
            for m in shown]
    out: list[RenderableType] = [Text("models that entered, left or changed platform "
                                      "(GPUs per job)"), indent(table(
        ["model", "change", "tenants", "GPUs per job", Column("ETT% before", justify="right"),
         Column("after", justify="right"), Column("GPU-h before", justify="right"),
         Column("after", justify="right"), Column("points", justify="right")],
        rows, terminal=terminal))]
    if len(shown) < len(changes):
        out.append(Text(f"({len(changes) - len(shown)} more: --format json lists them all)"))
    return out


def _notes(c: Comparison, terminal: bool) -> list[RenderableType]:
    """What the morning report says of its days, of the windows' job-days."""
    style = "yellow" if terminal else ""
    out: list[RenderableType] = []
    for span, side in ((c.before, c.fleet.before), (c.after, c.fleet.after)):
        if side.provisional_job_days:
            out.append(Text(f"provisional: {span.label} has {side.provisional_job_days} "
                            "job-day(s) of jobs still running, figures may grow", style=style))
        if side.synthetic_job_days:
            out.append(Text(f"synthetic data: {span.label} has {side.synthetic_job_days} "
                            "simulated job-day(s) (airflow-ett fleet simulate)", style=style))
    return out


def compare_view(c: Comparison, *, top: int = TOP, terminal: bool = False) -> RenderableType:
    """The whole comparison: headlines, the fleet's change by the models' fate, the two
    views, the models that entered, left or changed platform."""
    same = not c.entered and not c.left  # the cohort is the whole fleet
    parts: list[RenderableType] = [
        Text(f"windows {c.before.label} ({c.before.days} days) -> {c.after.label} "
             f"({c.after.days} days)"),
        _headline("fleet", c.fleet, terminal)]
    if same:
        parts.append(Text(f"cohort: all {c.cohort_models} models ran in both windows, so the "
                          "fixed cohort is the fleet as operated"))
    else:
        parts.append(_headline(f"cohort ({c.cohort_models} models in both)", c.cohort,
                               terminal))
    if c.churn is not None and not same:
        parts.append(Text(
            f"the fleet's change by model: cohort {_pts(c.churn.cohort_points)}, "
            f"entered {_pts(c.churn.entered_points)} ({len(c.entered)} model(s)), "
            f"left {_pts(c.churn.left_points)} ({len(c.left)} model(s))"))
    parts += _notes(c, terminal)
    parts += [Text(), _view("the fleet as operated", c.fleet, top, terminal)]
    if not same:
        parts += [Text(), _view("the fixed cohort (models that ran in both windows)",
                                c.cohort, top, terminal)]
    parts += [Text(), *_changes(c, top, terminal)]
    if c.platform_unknown:
        parts.append(Text(f"GPUs per job not stored for {len(c.platform_unknown)} cohort "
                          "model(s) (days rolled up by an older version): "
                          + ", ".join(c.platform_unknown[:top])))
    return Group(*parts)


def compare_text(c: Comparison, *, top: int = TOP, terminal: bool = False) -> str:
    return render_to_text(compare_view(c, top=top, terminal=terminal), terminal=terminal)
