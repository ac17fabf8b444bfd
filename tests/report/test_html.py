"""The HTML report (airflow_ett/report/html.py) without a browser: the page carries the
rollup's numbers, its charts are valid plotly specs of the same figures, nothing in it
points at the internet, and user strings never become markup.

The hand-computed days (tests/report/__init__.py): fleet ETT% 88.2 on D (7500 / 8500
GPU-s), 83.3 the day before (3000 / 3600 s), so the change is +4.9.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import os
import re
from pathlib import Path

import msgspec
import plotly.graph_objects as go  # type: ignore[import-untyped]
import plotly.offline  # type: ignore[import-untyped]
import pytest

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import FAILURE_CAUSES, Event
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.report import formatting as fmt
from airflow_ett.report import html as report
from airflow_ett.report.timeline import run_timeline
from airflow_ett.rollup import day_window
from tests.report import EVIL, EVIL_JOB, hand_days, retenant, rollup, small_fleet
from tests.rollup.scenarios import LO, PREVIOUS, WINDOW, D, job_a, job_b

SRC = report.PLOTLY_JS_NAME


def page(*, title: str = "Fleet") -> str:
    days, timelines = hand_days()
    return report.render_html(days, timelines, title=title, script_src=SRC)


def by_id(text: str, element_id: str) -> str:
    """The text content of the element with `element_id` (no nested elements)."""
    match = re.search(rf'id="{re.escape(element_id)}"[^>]*>([^<]*)<', text)
    assert match, f"no element {element_id!r} in the page"
    return match.group(1)


def embedded_figures(text: str) -> dict[str, dict[str, object]]:
    match = re.search(r'<script type="application/json" id="ett-figures">(.*?)</script>', text,
                      re.S)
    assert match
    out: dict[str, dict[str, object]] = json.loads(match.group(1))
    return out


def rows_of(text: str, section: str) -> list[list[str]]:
    """The table rows of `<section id=section>` as lists of cell texts, tags stripped."""
    match = re.search(rf'<section id="{section}">(.*?)</section>', text, re.S)
    assert match, section
    body = match.group(1).split("<tbody>", 1)[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


# -- numbers ---------------------------------------------------------------------------

def test_the_headline_is_the_last_days_figures_with_the_change() -> None:
    text = page()
    assert by_id(text, "fleet-ett") == "88.2"
    assert by_id(text, "fleet-ett-delta") == "+4.9 vs 2026-11-27"
    assert 'class="delta up"' in text
    assert by_id(text, "fleet-jobs") == "2"
    assert by_id(text, "fleet-gpu-hours") == "2.36"  # (3000 s x 2 GPUs + 2500 s) / 3600
    assert by_id(text, "fleet-lost") == "0.28"  # 1000 s lost on 1 GPU
    assert "failures per attempt <b>0.500</b> (0.500 without preemption)" in text
    assert "NoF <b>1 (infra 1)</b>" in text
    assert "TTR p50 / p90 <b>11.7 min / 11.7 min</b>" in text  # 700 s
    assert "2026-11-27 to 2026-11-28 (UTC)" in text
    # Level 3 inside effective training: these jobs' steps kept their ideal pace
    assert (by_id(text, "fleet-slow-steps"), by_id(text, "fleet-slow-steps-pct")) == (
        "0.00", "0.0%")


def test_one_day_alone_has_no_change_and_days_may_come_in_any_order() -> None:
    days, timelines = hand_days()
    alone = report.render_html(days[1:], timelines, title="x", script_src=SRC)
    assert "fleet-ett-delta" not in alone and "no previous day in this report" in alone
    with_before = report.render_html(days[1:], timelines, title="x", before=days[0],
                                     script_src=SRC)
    assert by_id(with_before, "fleet-ett-delta") == "+4.9 vs 2026-11-27"
    assert embedded_figures(with_before)["ett_trend"]["data"][0]["x"] == [  # type: ignore[index]
        "2026-11-28"]  # `before` gives the change only, it is not charted
    with pytest.raises(ValueError, match="before: day 2026-11-28 is not before"):
        report.render_html(days[1:], timelines, title="x", before=days[1])
    reversed_ = report.render_html(days[::-1], timelines, title="x", script_src=SRC)
    assert reversed_ == page(title="x")


def test_the_tables_hold_the_components_what_if_and_top_runs() -> None:
    text = page()
    components = {row[0]: row for row in rows_of(text, "components")}
    assert list(components) == list(COMPONENTS)
    assert components["wasted_training"] == ["wasted_training", "7.1%", "0.17",
                                             "checkpoint-team", "<3%", "BREACH"]
    assert components["initialization"][-2:] == ["<1%", "ok"]
    assert components["effective_training"][1:3] == ["88.2%", "-"]  # its time is not lost
    what_if = rows_of(text, "what-if")
    gains = [float(row[2]) for row in what_if]
    assert gains == sorted(gains, reverse=True)
    assert what_if[0][:3] == ["cut wasted_training by 50%", "88.2 → 91.5", "+3.23"]
    (run,) = rows_of(text, "top-runs")
    assert run[:3] == ["b", "t2", "m1"] and run[6:] == ["0.28", "60.0", "wasted_training"]
    tenants = {row[0]: row for row in rows_of(text, "tenants")}
    assert tenants["t1"][1:3] == ["1", "100.0"] and tenants["t2"][2] == "60.0"
    assert tenants["t1"][5] == "0.00 (0.0%)"  # slow steps, of its effective GPU time
    teams = {row[0]: row for row in rows_of(text, "teams")}
    assert teams["checkpoint-team"][-1] == "wasted_training"


@pytest.mark.parametrize(("value", "text"), [
    (18430.4, "18,430"), (100.0, "100"), (12.345, "12.35"), (99.994, "99.99"),
    (0.2777, "0.28"), (0.0, "0.00"), (None, "-"), (float("nan"), "-"), (float("inf"), "-"),
])
def test_gpu_hours_are_formatted_for_fleets_large_and_small(value: float | None,
                                                            text: str) -> None:
    assert fmt.fmt_gpu_h(value) == text


def test_slow_steps_are_gpu_hours_and_their_share_of_effective_time() -> None:
    assert fmt.fmt_slow_steps(12.345, 3.14) == "12.35 (3.1%)"
    assert fmt.fmt_slow_steps(0.0, None) == "0.00"  # no effective GPU time: no share
    assert fmt.fmt_slow_steps(None, None) == "-"  # a day stored before the figure


def test_a_day_stored_before_slow_steps_shows_a_dash() -> None:
    days, timelines = hand_days()

    def stored_before(group: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in group.items()
                if k not in ("gpu_hours_lost_to_slow_steps", "slow_steps_pct_of_effective")}

    old = []
    for d in days:  # the JSON a day stored before the figure has: without its fields
        stored = msgspec.to_builtins(d)
        stored["fleet"] = stored_before(stored["fleet"])
        for scope in ("tenants", "models"):
            stored[scope] = {k: stored_before(g) for k, g in stored[scope].items()}
        old.append(msgspec.convert(stored, type=type(d)))
    assert old[-1].fleet.gpu_hours_lost_to_slow_steps is None
    text = report.render_html(old, timelines, title="x", script_src=SRC)
    assert (by_id(text, "fleet-slow-steps"), by_id(text, "fleet-slow-steps-pct")) == ("-", "-")
    assert {row[5] for row in rows_of(text, "tenants")} == {"-"}


def test_percentages_changes_and_durations_are_formatted_as_the_text_report() -> None:
    assert (fmt.fmt_pct(91.44), fmt.fmt_pct(None)) == ("91.4", "-")
    assert (fmt.fmt_delta(0.6), fmt.fmt_delta(-0.04), fmt.fmt_delta(0.0)) == (
        "+0.6", "-0.0", "+0.0")
    assert [fmt.fmt_duration(s) for s in (59.94, 700, 5400, None)] == [
        "59.9 s", "11.7 min", "1.50 h", "-"]


# -- charts ----------------------------------------------------------------------------

def test_the_page_embeds_every_chart_as_the_figures_function_makes_it() -> None:
    days, timelines = hand_days()
    text = page()
    specs = report.figures(days, timelines)
    assert list(specs) == [*report.FLEET_FIGURES, "timeline-0"]
    assert embedded_figures(text) == specs
    for key in specs:
        assert f'data-figure="{key}"' in text
    json.dumps(specs, allow_nan=False)  # plain JSON, as the UI's API returns it
    for spec in specs.values():
        go.Figure(spec)  # what the JSON says is still a valid plotly figure


def test_the_charts_plot_the_rollups_figures() -> None:
    days, _ = hand_days()
    trend = report.trend_figure(days)
    fleet = trend["data"][0]
    assert fleet["x"] == ["2026-11-27", "2026-11-28"]
    assert fleet["y"] == pytest.approx([100 * 3000 / 3600, 100 * 7500 / 8500])  # GPU-s
    assert trend["data"][1]["name"] == "SLO >=90%" and trend["data"][1]["y"] == [90.0, 90.0]
    assert {t["name"] for t in trend["data"][2:]} == {"t1", "t2"}
    assert all(t["visible"] == "legendonly" for t in trend["data"][2:])

    shares = report.shares_figure(days)
    assert [t["name"] for t in shares["data"]] == list(COMPONENTS)
    assert [t["marker"]["color"] for t in shares["data"]] == [
        report.COMPONENT_COLOURS[c] for c in COMPONENTS]
    wasted = shares["data"][COMPONENTS.index("wasted_training")]
    assert wasted["y"] == pytest.approx([0.0, 100 * 600 / 8500])
    assert shares["layout"]["barmode"] == "stack"

    lost = {t["name"]: t["y"] for t in report.lost_by_team_figure(days)["data"]}
    assert lost["checkpoint-team"] == pytest.approx([0.0, 600 / 3600])
    assert "ml-platform" not in lost  # owns effective training only: never loses

    failures = report.failures_figure(days)
    per_cause = {t["name"]: t["y"] for t in failures["data"][:len(FAILURE_CAUSES)]}
    assert list(per_cause) == list(FAILURE_CAUSES)
    assert per_cause["infra"] == [0.0, 0.5]  # D-1: one attempt, no failure; D: 1 of 2
    assert failures["data"][-1]["name"] == "without preemption"
    assert failures["data"][-1]["y"] == [0.0, 0.5]


def test_a_day_without_wall_time_is_a_gap_in_the_trend_not_zero() -> None:
    days, _ = hand_days()
    empty = rollup(day_window(D + dt.timedelta(days=1), "UTC"), [])
    trend = report.trend_figure([*days, empty])
    assert trend["data"][0]["y"][-1] is None
    assert report.failures_figure([*days, empty])["data"][0]["y"][-1] is None


def test_the_timeline_has_a_row_per_attempt_bars_by_component_and_failure_marks() -> None:
    timeline = run_timeline(attribute_job(job_b()))
    spec = report.timeline_figure(timeline)
    assert spec["layout"]["yaxis"]["categoryarray"] == [
        "queue / between attempts", "attempt 1", "attempt 2"]
    assert spec["layout"]["yaxis"]["autorange"] == "reversed"  # the first row on top
    bars = [t for t in spec["data"] if t["type"] == "bar"]
    assert [t["name"] for t in bars] == ["scheduling", "compilation", "effective_training",
                                         "wasted_training"]
    for trace in bars:
        assert trace["orientation"] == "h"
        assert trace["marker"]["color"] == report.COMPONENT_COLOURS[trace["name"]]
        mine = [b for b in timeline.bars if b.component == trace["name"]]
        # in minutes: E2E is 2500 s (from 600 s to 3 h the axis is in minutes)
        assert trace["base"] == pytest.approx([b.start_s / 60 for b in mine])
        assert trace["x"] == pytest.approx([(b.end_s - b.start_s) / 60 for b in mine])
    (mark,) = [t for t in spec["data"] if t["type"] == "scatter"]
    assert mark["name"] == "failure: infra" and mark["y"] == ["attempt 1"]
    assert mark["x"] == pytest.approx([f.at_s / 60 for f in timeline.failures])
    assert mark["text"] == ["infra"]
    assert spec["layout"]["xaxis"]["title"]["text"] == "time since submission (min)"
    assert spec["layout"]["title"]["text"] == "b (t2 / m1): ETT% 60.0, E2E 41.7 min"


def test_colours_are_fixed_one_per_component_and_cause() -> None:
    assert list(report.COMPONENT_COLOURS) == list(COMPONENTS)
    assert len(set(report.COMPONENT_COLOURS.values())) == len(COMPONENTS)
    assert list(report.CAUSE_COLOURS) == list(FAILURE_CAUSES)
    assert len(set(report.CAUSE_COLOURS.values())) == len(FAILURE_CAUSES)
    assert set(report.THEMES) == {"light", "dark"}
    assert "@media (prefers-color-scheme: dark)" in page()


# -- offline ---------------------------------------------------------------------------

def test_the_written_report_references_nothing_outside_its_directory(tmp_path: Path) -> None:
    days, timelines = small_fleet()
    index = report.write_html_report(tmp_path / "out", days, timelines, title="Fleet")
    assert index == tmp_path / "out" / "index.html"
    text = index.read_text(encoding="utf-8")
    assert not re.search(r"https?:|//[a-z0-9]", text, re.I), "a URL in the page"
    assert re.findall(r'\bsrc="([^"]*)"', text) == [SRC]
    assert "<link" not in text and "@import" not in text and "url(" not in text
    asset = tmp_path / "out" / SRC
    assert hashlib.sha256(asset.read_bytes()).hexdigest() == report.PLOTLY_JS_SHA256
    assert sorted(p.name for p in index.parent.iterdir()) == sorted(["index.html", SRC])


def test_a_rewrite_replaces_the_page_and_keeps_an_identical_bundle(tmp_path: Path) -> None:
    days, timelines = hand_days()
    index = report.write_html_report(tmp_path, days, timelines, title="first")
    inode = (tmp_path / SRC).stat().st_ino
    report.write_html_report(tmp_path, days, timelines, title="second")
    assert "<title>second</title>" in index.read_text(encoding="utf-8")
    assert (tmp_path / SRC).stat().st_ino == inode
    (tmp_path / SRC).write_text("damaged", encoding="utf-8")
    report.write_html_report(tmp_path, days, timelines, title="third")
    assert hashlib.sha256((tmp_path / SRC).read_bytes()).hexdigest() == report.PLOTLY_JS_SHA256
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_the_self_contained_page_inlines_the_bundle_and_loads_nothing() -> None:
    days, timelines = hand_days()
    text = report.render_html(days, timelines, title="Fleet")
    bundle = report.plotly_js_path().read_text(encoding="utf-8")
    assert f"<script>{bundle}</script>" in text
    outside_bundle = text.replace(bundle, "")
    assert not re.search(r"\b(src|href)=", outside_bundle)
    assert not re.search(r"https?:|//[a-z0-9]", outside_bundle, re.I)
    assert "<link" not in outside_bundle and "url(" not in outside_bundle


@pytest.mark.parametrize("src", ["https://cdn.plot.ly/plotly-2.0.min.js",
                                 "http://example.com/p.js", "//cdn.example/p.js",
                                 "data:text/javascript,alert(1)", "javascript:alert(1)"])
def test_a_script_src_that_leaves_the_site_is_refused(src: str) -> None:
    days, timelines = hand_days()
    with pytest.raises(ValueError, match="no internet access"):
        report.render_html(days, timelines, title="x", script_src=src)


def test_the_vendored_bundle_is_the_plotly_js_plotly_py_was_built_for() -> None:
    """Bumping plotly.py: fetch `plotly.js-basic-dist-min` of the plotly.js version it
    reports (npm pack), replace static/plotly-basic-*.min.js, update the constants."""
    assert plotly.offline.get_plotlyjs_version() == report.PLOTLY_JS_VERSION
    path = report.plotly_js_path()
    head = path.read_text(encoding="utf-8")[:200]
    assert f"plotly.js (basic - minified) v{report.PLOTLY_JS_VERSION}" in head
    assert hashlib.sha256(path.read_bytes()).hexdigest() == report.PLOTLY_JS_SHA256
    assert "MIT License" in (path.parent / "plotly.js-LICENSE.txt").read_text(encoding="utf-8")
    assert "</script" not in path.read_text(encoding="utf-8").lower()


# -- escaping --------------------------------------------------------------------------

def rename_job(events: list[Event], job: str) -> list[Event]:
    return [msgspec.structs.replace(e, job=job, id=f"{job}-{i}") for i, e in enumerate(events)]


def test_user_strings_never_become_markup() -> None:
    evil_b = attribute_job(rename_job(retenant(job_b(), EVIL), EVIL_JOB))
    a = attribute_job(retenant(job_a(), "t1"))
    days = [rollup(PREVIOUS, [a, evil_b]), rollup(WINDOW, [a, evil_b])]
    text = report.render_html(days, [run_timeline(evil_b)], title=f"report {EVIL}",
                              script_src=SRC)
    assert EVIL not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # shown, as text, in the tables
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt;" in text
    assert len(re.findall(r"<script\b", text)) == 5  # three JSON blocks, the bundle, ours
    assert "<title>report &lt;script&gt;" in text
    specs = embedded_figures(text)  # the JSON reads back, and its strings are plotly-escaped
    title = specs["timeline-0"]["layout"]["title"]["text"]  # type: ignore[index]
    assert title.startswith('&lt;img src=x onerror="alert(2)"&gt; (&lt;script&gt;')
    names = {t["name"] for t in specs["ett_trend"]["data"]}  # type: ignore[attr-defined]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in names


def test_the_embedded_json_cannot_close_its_script_element() -> None:
    out = report._script_json({"k": "</script><script>alert(1)</script>&<!--\u2028"})
    assert "<" not in out and ">" not in out and "&" not in out and "\u2028" not in out
    assert json.loads(str(out)) == {"k": "</script><script>alert(1)</script>&<!--\u2028"}


# -- odd days --------------------------------------------------------------------------

def test_no_days_is_a_clear_error_and_a_day_twice_too() -> None:
    with pytest.raises(ValueError, match="no rollup days to report"):
        report.render_html([], [], title="x")
    with pytest.raises(ValueError, match="no rollup days to report"):
        report.figures([])
    days, _ = hand_days()
    with pytest.raises(ValueError, match="day 2026-11-28 is given twice"):
        report.render_html([days[1], days[1]], [], title="x")


def test_a_day_without_jobs_says_so() -> None:
    text = report.render_html([rollup(WINDOW, [])], [], title="x", script_src=SRC)
    assert "No job ran on 2026-11-28" in text
    assert by_id(text, "fleet-ett") == "-" and by_id(text, "fleet-jobs") == "0"
    assert "no run lost GPU time this day" in text and "No run timeline" in text


def test_a_day_with_running_jobs_says_it_is_provisional() -> None:
    running = attribute_job(job_b()[:5], now=LO + 8000)
    day = rollup(WINDOW, [running])
    text = report.render_html([day], [run_timeline(running)], title="x", script_src=SRC)
    assert "Provisional: 1 of 1 jobs of 2026-11-28 were still running" in text
    assert rows_of(text, "top-runs")[0][0] == "b running"
    assert "provisional (still running)" in embedded_figures(text)["timeline-0"][
        "layout"]["title"]["text"]  # type: ignore[index]
    assert "Provisional" not in page()


def test_synthetic_jobs_are_called_synthetic() -> None:
    a, b = attribute_job(job_a()), attribute_job(job_b())
    days = [rollup(PREVIOUS, [a, b], synthetic=True), rollup(WINDOW, [a, b], synthetic=True)]
    text = report.render_html(days, [], title="x", script_src=SRC)
    assert "Synthetic data: 2 of 2 jobs of 2026-11-28 are simulated" in text
    assert "Days with synthetic jobs: 2026-11-27." in text
    assert "Synthetic" not in page()


def test_silent_jobs_are_named_in_the_html_and_the_text_report() -> None:
    from airflow_ett.console import render_to_text
    from airflow_ett.report.text import day_view

    (before, day), _ = hand_days()
    assert day.silent_note() is None
    silent = msgspec.structs.replace(day, silent_jobs=2, silent_after_s=6 * 3600.0)
    note = ("2 job(s) not ended and silent for over 6 h (abandoned?): counted only up to 6 h "
            "after their last event ([ett] rollup_silent_after_s)")
    assert silent.silent_note() == note
    assert html.escape(f"2026-11-28: {note}.") in report.render_html(
        [before, silent], [], title="x", script_src=SRC)
    assert f"silent: {note}" in render_to_text(day_view(silent, before), terminal=False)
    assert "silent" not in render_to_text(day_view(day, before), terminal=False)


def test_the_report_module_imports_no_airflow() -> None:
    """report/ruff.toml bans it in the source; this checks nothing pulls it in either."""
    import subprocess
    import sys

    code = ("import sys, airflow_ett.report.html; "
            "print(sorted(m for m in ('airflow', 'sqlalchemy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, env={**os.environ, "PYTHONPATH": "."})
    assert out.stdout.strip() == "[]"
