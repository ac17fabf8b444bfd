"""The fleet report as one HTML page with charts, rendered without internet access.

Pure functions of stored `DayRollup`s and `RunTimeline`s (no Airflow, SQL or torch:
report/ruff.toml). docs/decisions/0011-report-charts.md says why the charts are plotly:

- The figures are plotly figure specs (`{"data": [...], "layout": {...}}`), built with
  plotly.py's graph objects so that a misspelt property fails here, in a unit test, and
  not silently in a browser. `figures()` returns them as plain JSON-able dicts: the
  Airflow UI pages hand the same dicts to `Plotly.react` and never re-derive a chart.
- The JavaScript is plotly.js's *basic* bundle (bar, scatter, pie: all these charts
  need), vendored in `static/` at the version plotly.py 7.1.0 was built against, a
  quarter of the size of the full bundle plotly.py ships. `write_html_report` puts it
  beside index.html; `render_html` inlines it unless given a (relative) `script_src`.
  Nothing is fetched from anywhere: a `script_src` with a scheme is refused.
- Specs are theme-neutral (transparent backgrounds, no font colour); the page's script
  merges `THEMES["light"]` or `THEMES["dark"]` in, following `prefers-color-scheme`, and
  again when it changes. The UI pages merge the theme of the Airflow UI instead.

Escaping, because tenant names, job ids, attempt ids and phase names come from users: the
page's own text goes through Jinja2's autoescape; the figure JSON sits in a
`<script type="application/json">` with `<`, `>` and `&` written as `\\u003c` etc., so no
string can close the element; and every user string inside a figure is HTML-escaped once
more, because plotly.js reads `<b>`, `<a href>` and entities in chart text as markup
(escaped, it shows the literal text).

Numbers are formatted as the text report does: ETT% and shares with one decimal, the
change from the previous day signed (`+0.6`), GPU-hours with thousands separators.
"""

from __future__ import annotations

import datetime as dt
import functools
import html
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import jinja2
import plotly.graph_objects as go  # type: ignore[import-untyped]
from markupsafe import Markup

from airflow_ett._fs import atomic_write
from airflow_ett.ett.events import FAILURE_CAUSES
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.report.formatting import (
    fmt_delta,
    fmt_duration,
    fmt_gpu_h,
    fmt_pct,
    fmt_slow_steps,
)
from airflow_ett.report.timeline import OUTSIDE_ATTEMPTS, RunTimeline
from airflow_ett.rollup.day import DayRollup

#: The vendored plotly.js bundle: npm `plotly.js-basic-dist-min`, the plotly.js version
#: that plotly.py (pinned) validates figures against; tests/report checks they agree.
PLOTLY_JS_VERSION: Final = "4.1.1"
PLOTLY_JS_NAME: Final = f"plotly-basic-{PLOTLY_JS_VERSION}.min.js"
PLOTLY_JS_SHA256: Final = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"

#: One fixed colour per Level-2 component, everywhere (charts, tables, UI pages), from the
#: Okabe-Ito palette (told apart with the common colour-vision deficiencies): effective
#: training green, waiting grey, starts in warm colours, lost work vermillion.
COMPONENT_COLOURS: Final[Mapping[str, str]] = {
    "scheduling": "#8C8C8C",
    "initialization": "#E69F00",
    "compilation": "#CC79A7",
    "effective_training": "#009E73",
    "wasted_training": "#D55E00",
    "shutdown": "#0072B2",
}
#: Failure causes: the marks on a timeline and the failures chart.
CAUSE_COLOURS: Final[Mapping[str, str]] = {
    "preemption": "#56B4E9",
    "infra": "#E69F00",
    "application": "#B2182B",
    "unknown": "#8C8C8C",
}
#: The failure rate without preemption (a line over the causes' bars): seen on both themes.
WITHOUT_PREEMPTION_COLOUR: Final = "#AA4499"
#: Teams and tenants (their names are configuration, not fixed): taken in order.
SERIES_COLOURS: Final = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                         "#8C6D31", "#7F7F7F", "#17BECF", "#BCBD22")

#: The layout patches of the two themes, merged over every figure's layout (and `axis`
#: over each of its axes) by the page's script; the pages of the Airflow UI use them too.
THEMES: Final[Mapping[str, Mapping[str, Any]]] = {
    "light": {
        "layout": {"font": {"color": "#1F2328"},
                   "hoverlabel": {"bgcolor": "#FFFFFF", "font": {"color": "#1F2328"}},
                   "modebar": {"bgcolor": "rgba(0,0,0,0)", "color": "#8C959F",
                               "activecolor": "#1F2328"}},
        "axis": {"gridcolor": "#D8DEE4", "linecolor": "#8C959F", "zerolinecolor": "#8C959F"},
    },
    "dark": {
        "layout": {"font": {"color": "#E6EDF3"},
                   "hoverlabel": {"bgcolor": "#161B22", "font": {"color": "#E6EDF3"}},
                   "modebar": {"bgcolor": "rgba(0,0,0,0)", "color": "#6E7681",
                               "activecolor": "#E6EDF3"}},
        "axis": {"gridcolor": "#30363D", "linecolor": "#6E7681", "zerolinecolor": "#6E7681"},
    },
}
#: What the page passes to Plotly.react: no plotly logo (a link to the web); not plotly's
#: `responsive` mode, which lost the charts' height on a resize: `static/ett-charts.js`
#: sizes every chart to its box and redraws it when the box's width changes.
PLOTLY_CONFIG: Final[Mapping[str, Any]] = {"displaylogo": False, "responsive": False}
#: The script that draws the figures (the report inlines it; the UI pages serve it).
CHARTS_JS_NAME: Final = "ett-charts.js"

#: Fleet figure keys, in page order; a timeline's key is `timeline-<i>`, i its position.
FLEET_FIGURES: Final = ("ett_trend", "shares", "lost_by_team", "failures")
TREND_TENANTS: Final = 8  # tenants drawn (hidden until clicked) on the trend chart
_FONT: Final = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', sans-serif"
_OUTSIDE_LABEL: Final = "queue / between attempts"
_SLO_MIN: Final = re.compile(r"^>=\s*([0-9]+(?:\.[0-9]+)?)%$")


# -- formatting (shared by the headline and the tables) ------------------------------

def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _chart_text(text: str) -> str:
    """A user string as plotly.js chart text: its pseudo-HTML (`<b>`, `<a href>`,
    entities) shown as the literal characters, never interpreted."""
    return html.escape(text, quote=False)


# -- figures -------------------------------------------------------------------------

def _spec(fig: Any) -> dict[str, Any]:
    """The figure as plain JSON data (what `Plotly.react` takes, what the API returns)."""
    out: dict[str, Any] = json.loads(fig.to_json())
    return out


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "template": "none",
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        "font": {"family": _FONT, "size": 12},
        "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)",
        "margin": {"l": 60, "r": 20, "t": 48, "b": 40},
        "legend": {"orientation": "h", "x": 0, "y": -0.14, "yanchor": "top"},
        "height": 360,
    }
    layout.update(extra)
    return layout


def _days_axis() -> dict[str, Any]:
    # Category, not date: a day is a label here, and a gap in the days is not stretched.
    # No axis title: the ticks are dates, and a title would sit on the legend below.
    return {"type": "category"}


def _sorted_days(days: Sequence[DayRollup]) -> list[DayRollup]:
    if not days:
        raise ValueError("no rollup days to report: compute them first (airflow-ett rollup)")
    ordered = sorted(days, key=lambda d: d.day)
    for before, after in itertools.pairwise(ordered):
        if before.day == after.day:
            raise ValueError(f"day {after.day} is given twice: one rollup per day")
    return ordered


def _ett_slo(day: DayRollup) -> float | None:
    for row in day.slo:
        if row.component == EFFECTIVE:
            match = _SLO_MIN.match(row.target)
            return float(match.group(1)) if match else None
    return None


def trend_figure(days: Sequence[DayRollup]) -> dict[str, Any]:
    """Fleet ETT% by day (a day without wall time is a gap, not 0%), the ETT SLO of the
    last day as a dashed line, and the largest tenants, hidden until clicked."""
    ordered = _sorted_days(days)
    x = [d.day for d in ordered]
    traces = [go.Scatter(
        x=x, y=[d.fleet.ett_pct for d in ordered],
        name="fleet", mode="lines+markers", line={"color": COMPONENT_COLOURS[EFFECTIVE],
                                                  "width": 3},
        hovertemplate="%{x}: fleet ETT% %{y:.1f}<extra></extra>")]
    slo = _ett_slo(ordered[-1])
    if slo is not None:
        traces.append(go.Scatter(x=x, y=[slo] * len(x), name=f"SLO >={slo:g}%", mode="lines",
                                 line={"dash": "dash", "color": "#8C8C8C", "width": 1.5},
                                 hoverinfo="skip"))
    last = ordered[-1]
    biggest = sorted(last.tenants, key=lambda t: (-last.tenants[t].gpu_hours, t))
    for i, tenant in enumerate(biggest[:TREND_TENANTS]):
        ys = [d.tenants[tenant].ett_pct if tenant in d.tenants else None for d in ordered]
        name = _chart_text(tenant)
        traces.append(go.Scatter(
            x=x, y=ys, name=name, mode="lines+markers", visible="legendonly",
            line={"color": SERIES_COLOURS[i % len(SERIES_COLOURS)], "width": 1.5},
            hovertemplate=f"%{{x}}: {name} ETT% %{{y:.1f}}<extra></extra>"))
    layout = _layout("Fleet ETT% by day (tenants: click to show)", xaxis=_days_axis(),
                     yaxis={"title": {"text": "ETT %"}, "ticksuffix": "%"})
    return _spec(go.Figure(data=traces, layout=layout))


def shares_figure(days: Sequence[DayRollup]) -> dict[str, Any]:
    """The six Level-2 shares of the fleet's GPU time, stacked by day (a day without GPU
    time is a gap). Effective training
    starts hidden (click it to stack to 100%): otherwise the lost time is a sliver."""
    ordered = _sorted_days(days)
    x = [d.day for d in ordered]
    traces = [go.Bar(
        x=x, y=[d.fleet.shares_pct.get(c) for d in ordered],
        name=c, marker={"color": COMPONENT_COLOURS[c]},
        visible="legendonly" if c == EFFECTIVE else True,
        hovertemplate=f"{c}: %{{y:.2f}}%<extra>%{{x}}</extra>") for c in COMPONENTS]
    layout = _layout("Level-2 shares of fleet GPU time (effective training: click to show)",
                     barmode="stack", xaxis=_days_axis(),
                     yaxis={"title": {"text": "share of GPU time"}, "ticksuffix": "%"})
    return _spec(go.Figure(data=traces, layout=layout))


def lost_by_team_figure(days: Sequence[DayRollup]) -> dict[str, Any]:
    """GPU-hours lost by owning team, stacked by day; the team that lost most on the last
    day at the bottom. A team that never lost anything (the owner of effective training
    alone) is left out."""
    ordered = _sorted_days(days)
    x = [d.day for d in ordered]
    lost: dict[str, list[float]] = {}
    for i, d in enumerate(ordered):
        for row in d.teams:
            lost.setdefault(row.team, [0.0] * len(ordered))[i] = row.gpu_hours_lost
    last = {t.team: t.gpu_hours_lost for t in ordered[-1].teams}
    names = sorted((t for t in lost if any(v > 0 for v in lost[t])),
                   key=lambda t: (-last.get(t, 0.0), t))
    traces = []
    for i, team in enumerate(names):
        name = _chart_text(team)
        traces.append(go.Bar(x=x, y=lost[team], name=name,
                             marker={"color": SERIES_COLOURS[i % len(SERIES_COLOURS)]},
                             hovertemplate=f"{name}: %{{y:,.2f}} GPU-h<extra>%{{x}}</extra>"))
    layout = _layout("GPU-hours lost by owning team", barmode="stack", xaxis=_days_axis(),
                     yaxis={"title": {"text": "GPU-hours lost"}})
    return _spec(go.Figure(data=traces, layout=layout))


def failures_figure(days: Sequence[DayRollup]) -> dict[str, Any]:
    """Failures per attempt by cause, stacked by day (the stack is the rate with
    preemption), and the rate without preemption (per attempt not preempted) as a line."""
    ordered = _sorted_days(days)
    x = [d.day for d in ordered]
    traces: list[Any] = []
    for cause in FAILURE_CAUSES:
        ys = [d.fleet.nof.get(cause, 0) / d.fleet.attempts if d.fleet.attempts else None
              for d in ordered]
        traces.append(go.Bar(x=x, y=ys, name=cause, marker={"color": CAUSE_COLOURS[cause]},
                             hovertemplate=f"{cause}: %{{y:.3f}} per attempt"
                                           "<extra>%{x}</extra>"))
    traces.append(go.Scatter(
        x=x, y=[d.fleet.failures_per_attempt_without_preemption if d.fleet.attempts else None
                for d in ordered],
        name="without preemption", mode="lines+markers",
        line={"color": WITHOUT_PREEMPTION_COLOUR, "dash": "dot", "width": 2.5},
        hovertemplate="without preemption: %{y:.3f}<extra>%{x}</extra>"))
    layout = _layout("Failures per attempt, by cause", barmode="stack", xaxis=_days_axis(),
                     yaxis={"title": {"text": "failures per attempt"}, "rangemode": "tozero"})
    return _spec(go.Figure(data=traces, layout=layout))


def _time_unit(e2e_s: float) -> tuple[str, float]:
    if e2e_s >= 3 * 3600:
        return "h", 3600.0
    if e2e_s >= 600:
        return "min", 60.0
    return "s", 1.0


def _row_label(row: str) -> str:
    return _OUTSIDE_LABEL if row == OUTSIDE_ATTEMPTS else _chart_text(f"attempt {row}")


def timeline_title(timeline: RunTimeline) -> str:
    """`job (tenant / model): ETT% 81.8, E2E 1.53 h`, as plain text (not escaped)."""
    who = " / ".join(x for x in (timeline.tenant, timeline.model) if x)
    flag = ", provisional (still running)" if timeline.provisional else ""
    return (f"{timeline.job}{f' ({who})' if who else ''}: ETT% {fmt_pct(timeline.ett_pct)}, "
            f"E2E {fmt_duration(timeline.e2e_s)}{flag}")


def timeline_figure(timeline: RunTimeline) -> dict[str, Any]:
    """One row per attempt (the time outside every attempt on a row of its own, on top),
    its phases as bars coloured by component, each failure an x with its cause."""
    unit, scale = _time_unit(timeline.e2e_s)
    labels = [_row_label(r) for r in timeline.rows]
    traces: list[Any] = []
    for component in COMPONENTS:
        bars = [b for b in timeline.bars if b.component == component and b.end_s > b.start_s]
        if not bars:
            continue
        traces.append(go.Bar(
            orientation="h", name=component, marker={"color": COMPONENT_COLOURS[component]},
            y=[_row_label(b.row) for b in bars],
            base=[b.start_s / scale for b in bars],
            x=[(b.end_s - b.start_s) / scale for b in bars],
            customdata=[[_chart_text(b.phase), fmt_duration(b.start_s),
                         fmt_duration(b.end_s - b.start_s)] for b in bars],
            hovertemplate="%{customdata[0]}: %{customdata[2]} from %{customdata[1]}"
                          f"<extra>{component}</extra>",
            width=0.6))
    for cause in sorted({f.cause for f in timeline.failures},
                        key=lambda c: (FAILURE_CAUSES.index(c) if c in FAILURE_CAUSES
                                       else len(FAILURE_CAUSES), c)):
        marks = [f for f in timeline.failures if f.cause == cause]
        text = _chart_text(cause)
        traces.append(go.Scatter(
            mode="markers+text", name=f"failure: {text}",
            x=[f.at_s / scale for f in marks], y=[_row_label(f.attempt) for f in marks],
            text=[text] * len(marks), textposition="top center",
            marker={"symbol": "x", "size": 13, "color": CAUSE_COLOURS.get(cause, "#8C8C8C"),
                    "line": {"width": 1, "color": "#FFFFFF"}},
            hovertemplate=f"failure ({text}) at %{{x:.2f}} {unit}<extra></extra>"))
    layout = _layout(
        _chart_text(timeline_title(timeline)), barmode="overlay",
        height=130 + 44 * max(len(labels), 1),
        margin={"l": 170, "r": 20, "t": 48, "b": 40},
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "xanchor": "left",
                "traceorder": "normal"},
        xaxis={"title": {"text": f"time since submission ({unit})"}, "rangemode": "tozero"},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": labels,
               "autorange": "reversed"})
    layout["title"]["y"] = 0.98
    layout["margin"]["t"] = 80
    return _spec(go.Figure(data=traces, layout=layout))


def fleet_figures(days: Sequence[DayRollup]) -> dict[str, dict[str, Any]]:
    return {"ett_trend": trend_figure(days), "shares": shares_figure(days),
            "lost_by_team": lost_by_team_figure(days), "failures": failures_figure(days)}


def figures(days: Sequence[DayRollup],
            timelines: Sequence[RunTimeline] = ()) -> dict[str, dict[str, Any]]:
    """Every chart of the report as a plotly figure spec (JSON-able), keyed as
    `FLEET_FIGURES` then `timeline-0`, `timeline-1`... in the order given."""
    out = fleet_figures(days)
    for i, timeline in enumerate(timelines):
        out[f"timeline-{i}"] = timeline_figure(timeline)
    return out


# -- the page --------------------------------------------------------------------------

def plotly_js_path() -> Path:
    """The vendored plotly.js bundle (what a web app serves once as a static file)."""
    return Path(str(resources.files("airflow_ett.report") / "static" / PLOTLY_JS_NAME))


def charts_js_path() -> Path:
    """`static/ett-charts.js`: draws the figures at their size and keeps it on a resize."""
    return Path(str(resources.files("airflow_ett.report") / "static" / CHARTS_JS_NAME))


def _script_json(value: object) -> Markup:
    """JSON for a `<script type="application/json">`: `<`, `>`, `&` (and the two line
    separators JavaScript once choked on) as escapes, so no string can end the element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return Markup(text)  # escaped just above: no markup in it


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("airflow_ett.report", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _inline_script(path: Path) -> Markup:
    text = path.read_text(encoding="utf-8")
    # The scripts have no "</script" today; if a later one did, it would end the element.
    return Markup(re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE))


@functools.cache
def _inline_plotly_js() -> Markup:
    return _inline_script(plotly_js_path())


def _check_script_src(src: str) -> str:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//", src):
        raise ValueError(f"script_src: {src!r} is not a path on the same site: the report "
                         "must render with no internet access (serve the bundled "
                         f"{PLOTLY_JS_NAME}: plotly_js_path())")
    return src


def _notes(ordered: Sequence[DayRollup]) -> list[str]:
    last = ordered[-1]
    notes = []
    if last.provisional:
        notes.append(f"Provisional: {last.fleet.provisional_jobs} of {last.fleet.jobs} jobs "
                     f"of {last.day} were still running when it was computed "
                     f"({_utc(last.computed_at)}); its figures change when it is recomputed.")
    earlier = [d.day for d in ordered[:-1] if d.provisional]
    if earlier:
        notes.append(f"Also provisional (recompute them): {', '.join(earlier)}.")
    if last.synthetic_jobs:
        notes.append(f"Synthetic data: {last.synthetic_jobs} of {last.fleet.jobs} jobs of "
                     f"{last.day} are simulated (airflow-ett fleet simulate), not measured.")
    synthetic_days = [d.day for d in ordered[:-1] if d.synthetic_jobs]
    if synthetic_days:
        notes.append(f"Days with synthetic jobs: {', '.join(synthetic_days)}.")
    silent = last.silent_note()
    if silent is not None:
        notes.append(f"{last.day}: {silent}.")
    return notes


def _headline(ordered: Sequence[DayRollup], before: DayRollup | None) -> dict[str, Any]:
    last = ordered[-1]
    previous = ordered[-2] if len(ordered) > 1 else before
    f = last.fleet
    delta = None
    if previous is not None and previous.fleet.ett_pct is not None and f.ett_pct is not None:
        delta = f.ett_pct - previous.fleet.ett_pct
    causes = ", ".join(f"{c} {f.nof.get(c, 0)}" for c in FAILURE_CAUSES if f.nof.get(c, 0))
    return {
        "day": last.day, "tz": last.tz,
        "ett": fmt_pct(f.ett_pct),
        "delta": fmt_delta(delta) if delta is not None else None,
        "delta_class": "" if delta is None else ("up" if delta > 0 else
                                                 "down" if delta < 0 else ""),
        "previous": previous.day if previous is not None else None,
        "jobs": f"{f.jobs:,}", "gpu_hours": fmt_gpu_h(f.gpu_hours),
        "lost": fmt_gpu_h(f.gpu_hours_lost),
        "slow_steps": fmt_gpu_h(f.gpu_hours_lost_to_slow_steps),
        "slow_steps_pct": _share(f.slow_steps_pct_of_effective),
        "failures_per_attempt": f"{f.failures_per_attempt:.3f}",
        "failures_without_preemption": f"{f.failures_per_attempt_without_preemption:.3f}",
        "preemptions": f"{f.nof.get('preemption', 0):,}",
        "nof": f"{f.nof.get('total', 0):,}" + (f" ({causes})" if causes else ""),
        "attempts_per_job": f"{f.attempts_per_job:.2f}",
        "tts": f"{fmt_duration(f.tts_p50_s)} / {fmt_duration(f.tts_p90_s)}",
        "ttr": f"{fmt_duration(f.ttr_p50_s)} / {fmt_duration(f.ttr_p90_s)}",
        "empty": f.jobs == 0,
    }


def _share(value: float | None) -> str:
    """A share of the GPU time, `-` without a `%` for a day with none."""
    return "-" if value is None else fmt_pct(value) + "%"


def _tables(last: DayRollup) -> dict[str, Any]:
    components = [{
        "component": row.component, "colour": COMPONENT_COLOURS.get(row.component, "#8C8C8C"),
        "share": _share(row.share_pct),
        "lost": "-" if row.component == EFFECTIVE else fmt_gpu_h(row.gpu_hours_lost),
        "owner": row.owner, "target": row.target, "status": row.status,
    } for row in last.slo]
    teams = [{"team": t.team, "components": ", ".join(t.components),
              "share": _share(t.share_pct), "lost": fmt_gpu_h(t.gpu_hours_lost),
              "breaches": ", ".join(t.breaches) or "-"} for t in last.teams]
    what_if = [{"label": w.label, "before": fmt_pct(w.ett_pct_before),
                "after": fmt_pct(w.ett_pct_after), "gain": f"{w.gain_pts:+.2f}",
                "saved": fmt_duration(w.e2e_s_saved), "gpu_h": fmt_gpu_h(w.gpu_hours_saved)}
               for w in sorted(last.what_if, key=lambda w: -w.gain_pts)]
    tenants = [{"tenant": name, "jobs": f"{g.jobs:,}", "ett": fmt_pct(g.ett_pct),
                "gpu_h": fmt_gpu_h(g.gpu_hours), "lost": fmt_gpu_h(g.gpu_hours_lost),
                "slow": fmt_slow_steps(g.gpu_hours_lost_to_slow_steps,
                                       g.slow_steps_pct_of_effective),
                "fpa": f"{g.failures_per_attempt:.3f}", "provisional": g.provisional_jobs}
               for name, g in sorted(last.tenants.items(),
                                     key=lambda kv: (-kv[1].gpu_hours_lost, kv[0]))]
    runs = [{"job": r.job, "tenant": r.tenant, "model": r.model,
             "run": " / ".join(x for x in (r.dag_id, r.run_id) if x) or "-",
             "gpus": f"{r.gpus:,}", "gpu_h": fmt_gpu_h(r.gpu_hours),
             "lost": fmt_gpu_h(r.gpu_hours_lost), "ett": fmt_pct(r.ett_pct),
             "worst": r.worst_component,
             "colour": COMPONENT_COLOURS.get(r.worst_component, "#8C8C8C"),
             "provisional": r.provisional} for r in last.top_runs]
    return {"components": components, "teams": teams, "what_if": what_if,
            "tenants": tenants, "top_runs": runs}


def render_html(days: Sequence[DayRollup], timelines: Sequence[RunTimeline] = (), *,
                title: str, before: DayRollup | None = None,
                script_src: str | None = None) -> str:
    """The report page for `days` (any order; the latest is the headline day) and the
    timelines of its worst runs. The headline's change is from the day before the latest
    among `days`, or from `before` (the day before the first, as the text report takes
    it) when `days` is one day; the charts show `days` only.

    plotly.js is inlined (a self-contained page, about 1.2 MB) unless `script_src` names
    where the page finds it: a relative path or a path on the same site, never a URL with
    a scheme (ValueError). Raises ValueError for no days or a day given twice.
    """
    ordered = _sorted_days(days)
    if before is not None and before.day >= ordered[0].day:
        raise ValueError(f"before: day {before.day} is not before the first day "
                         f"{ordered[0].day}")
    specs = figures(ordered, timelines)
    last = ordered[-1]
    template = _environment().get_template("report.html.j2")
    return template.render(
        title=title,
        last=last,
        computed=_utc(last.computed_at),
        headline=_headline(ordered, before),
        notes=_notes(ordered),
        tables=_tables(last),
        days_shown=f"{ordered[0].day} to {last.day}" if len(ordered) > 1 else last.day,
        fleet_figures=[(key, specs[key]["layout"].get("title", {}).get("text", key))
                       for key in FLEET_FIGURES],
        timelines=[(f"timeline-{i}", timeline_title(t), t) for i, t in enumerate(timelines)],
        component_colours=COMPONENT_COLOURS,
        figures_json=_script_json(specs),
        themes_json=_script_json(THEMES),
        config_json=_script_json(PLOTLY_CONFIG),
        script_src=_check_script_src(script_src) if script_src is not None else None,
        plotly_js=_inline_plotly_js() if script_src is None else None,
        charts_js=_inline_script(charts_js_path()),
        plotly_js_name=PLOTLY_JS_NAME,
        plotly_js_version=PLOTLY_JS_VERSION,
    )


def write_html_report(out_dir: Path, days: Sequence[DayRollup],
                      timelines: Sequence[RunTimeline] = (), *, title: str,
                      before: DayRollup | None = None) -> Path:
    """`out_dir/index.html` and the plotly.js bundle beside it, each written atomically;
    the bundle first, so a reader never gets a page whose script is missing. Returns the
    page's path. `before` as in `render_html`."""
    page = render_html(days, timelines, title=title, before=before, script_src=PLOTLY_JS_NAME)
    out_dir.mkdir(parents=True, exist_ok=True)
    bundle = plotly_js_path().read_bytes()
    asset = out_dir / PLOTLY_JS_NAME
    if not (asset.is_file() and asset.stat().st_size == len(bundle)
            and asset.read_bytes() == bundle):  # sized first: never read a planted giant
        atomic_write(asset, bundle)
    index = out_dir / "index.html"
    atomic_write(index, page.encode("utf-8"))
    return index
