"""The HTML report in a real headless Chromium (Debian's `chromium` package, driven by
Python Playwright with `executable_path`; Playwright's own browser download is never used).

A small simulated fleet (tests/report/__init__.py: three days, every failure cause, a job
across midnight still running, a tenant named `<script>alert(1)</script>`) is written with
`write_html_report` and opened from file://, in the light and the dark colour scheme:
every chart must be drawn by plotly.js with the traces its spec has, nothing may be
requested outside file://, no console error nor dialog may appear, and the injected
tenant must show as text. Then the window is resized, smaller and larger, and every chart
must keep its plot's height and stay off the tables (tests/browser.py `check_resizes`);
and a fleet of 8, 12 and 20 tenants must leave the trend chart the plot its spec gives
it, however many rows its legend takes. Full-page screenshots are kept as test artifacts
in `$ETT_TEST_ARTIFACTS/report/` (default `tests/artifacts/report/`): look at them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.ett.synthetic import JobSpec, simulate
from airflow_ett.report import html as report
from airflow_ett.rollup import day_window
from tests.browser import artifacts_dir, check_resizes, launched_chromium, wait_drawn
from tests.report import EVIL, FLEET_DAYS, rollup, small_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]





# Each chart: how many traces plotly.js drew, of which types, and whether any was dropped
# (a trace type missing from the basic bundle comes back with visible=false).
_CHARTS_JS = """() => Array.from(document.querySelectorAll('[data-figure]')).map(n => ({
  key: n.getAttribute('data-figure'),
  plotted: n.classList.contains('js-plotly-plot'),
  error: n.getAttribute('data-error'),
  types: (n._fullData || []).map(t => t.type),
  dropped: (n._fullData || []).filter(t => t.visible === false).length,
  svgs: n.querySelectorAll('svg.main-svg').length,
  points: n.querySelectorAll('.point').length,
  title: (n.querySelector('.gtitle') || {}).textContent || '',
  fontColour: n._fullLayout ? n._fullLayout.font.color : null,
}))"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as launched:
        yield launched


def test_the_report_renders_offline_in_chromium(browser: Any) -> None:
    days, timelines = small_fleet(timelines=3)
    assert EVIL in {t.tenant for t in timelines}, "the fleet must show the injection"
    out = artifacts_dir("report")
    index = report.write_html_report(out / "site", days, timelines, title="ETT fleet report")
    specs = report.figures(days, timelines)

    for scheme in ("light", "dark"):
        charts = _open(browser, index, scheme, out / f"fleet-report-{scheme}.png")
        assert [c["key"] for c in charts] == list(specs)
        for chart in charts:
            spec = specs[chart["key"]]
            assert chart["plotted"] and not chart["error"], chart
            assert chart["types"] == [t["type"] for t in spec["data"]], chart["key"]
            assert chart["dropped"] == 0, chart
            assert chart["svgs"] >= 1 and chart["points"] > 0, chart
            assert chart["fontColour"] == report.THEMES[scheme]["layout"]["font"][
                "color"], (scheme, chart["key"])
        # plotly shows each title as the literal text: the escaped tenant too
        shown = {c["key"]: c["title"] for c in charts}
        for i, timeline in enumerate(timelines):
            assert shown[f"timeline-{i}"] == report.timeline_title(timeline)


def _open(browser: Any, index: Path, scheme: str, screenshot: Path) -> list[dict[str, Any]]:
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  color_scheme=scheme, service_workers="block")
    page = context.new_page()
    errors: list[str] = []
    outside: list[str] = []
    dialogs: list[str] = []
    def console(message: Any) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    def dialog(opened: Any) -> None:
        dialogs.append(opened.message)
        opened.dismiss()

    page.on("dialog", dialog)

    def route(r: Any) -> None:
        if r.request.url.startswith(("file://", "data:", "blob:", "about:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    try:
        page.goto(index.as_uri(), wait_until="load")
        expected = len(page.query_selector_all("[data-figure]"))
        # every chart drawn, or the page's script said plotly.js did not load
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot').length === {expected}"
            " || document.querySelector('[data-error]') !== null", timeout=30_000)
        wait_drawn(page)
        charts: list[dict[str, Any]] = page.evaluate(_CHARTS_JS)
        # The tables show the injected tenant as text, and it created no element.
        assert page.get_by_text(EVIL, exact=True).count() >= 1
        assert page.evaluate("document.querySelectorAll('script').length") == 5
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == ("rgb(13, 17, 23)" if scheme == "dark" else "rgb(255, 255, 255)")
        page.screenshot(path=str(screenshot), full_page=True)
        check_resizes(page, page, f"the report ({scheme})")
        page.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-resized.png")),
                        full_page=True)
    finally:
        context.close()
    assert not errors, f"console errors ({scheme}): {errors}"
    assert not outside, f"requests outside file:// ({scheme}): {outside}"
    assert not dialogs, f"a dialog opened ({scheme}): injected script ran: {dialogs}"
    assert screenshot.stat().st_size > 50_000
    return charts


def _tenants_fleet(n: int) -> list[report.DayRollup]:
    """Two days of `n` tenants with names as long as real ones, a short job each."""
    days = []
    for k, day in enumerate(FLEET_DAYS[:2]):
        window = day_window(day, "UTC")
        attributions = []
        for i in range(n):
            spec = JobSpec(job=f"t{n}-{k}-{i}", tenant=f"tenant-{i:02d}-recommendations-team",
                           dag_id=None, submit_ts=window.lo + 3600 + 60 * i, steps=40 + i,
                           world_size=8)
            from airflow_ett.ett.attribution import attribute_job

            attributions.append(attribute_job(simulate(spec)))
        days.append(rollup(window, attributions))
    return days


@pytest.mark.parametrize("tenants", [8, 12, 20])
def test_many_tenants_leave_the_trend_its_plot(tenants: int, browser: Any) -> None:
    """The trend chart's legend (the fleet, the SLO and the largest tenants) wraps into
    rows; the chart grows by them, so its plot keeps the height its spec gives it, at a
    wide window and at a narrow one."""
    days = _tenants_fleet(tenants)
    assert len(days[-1].tenants) == tenants
    out = artifacts_dir("report")
    index = report.write_html_report(out / f"tenants-{tenants}", days, title="tenants")
    spec = report.trend_figure(days)["layout"]
    wanted = spec["height"] - spec["margin"]["t"] - spec["margin"]["b"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(index.as_uri(), wait_until="load")
        for width in (1280, 620):
            page.set_viewport_size({"width": width, "height": 900})
            trend = next(c for c in wait_drawn(page) if c["key"] == "ett_trend")
            assert trend["plotHeight"] >= wanted - 1, (tenants, width, trend)
            assert trend["plotWidth"] > 0.6 * trend["right"] - 0.6 * trend["left"]
            legend = page.evaluate(
                "() => { const l = document.querySelector('#chart-ett_trend .legend')"
                ".getBoundingClientRect(); return {top: l.top + scrollY, "
                "bottom: l.bottom + scrollY}; }")
            assert legend["bottom"] <= trend["bottom"] + 0.5, (tenants, width)
            page.screenshot(path=str(out / f"tenants-{tenants}-{width}.png"),
                            full_page=True)
    finally:
        page.close()
