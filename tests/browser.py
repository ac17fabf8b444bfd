"""What the browser tests share: Debian's chromium (no browser download here), the flags it
needs on a closed network, and where screenshots go.

`scripts/test.sh` installs the `chromium` package when it is missing (as root, with
apt-get); without it the browser tests skip with the install command as the reason, which
CI (ETT_REQUIRE_SERVICES=1) counts as a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
# ../shared/TESTING.md "Browser tests": without the background-networking flags the
# browser's own connections (refused on a closed network) fill the log.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def artifacts_dir(name: str) -> Path:
    """`$ETT_TEST_ARTIFACTS/<name>/`, default `tests/artifacts/<name>/` (git-ignored)."""
    base = os.environ.get("ETT_TEST_ARTIFACTS")
    out = (Path(base) if base else ROOT / "tests" / "artifacts") / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def chromium() -> str:
    found = str(CHROMIUM) if CHROMIUM.is_file() else shutil.which("chromium")
    if not found:
        pytest.skip("no Chromium: the browser tests need Debian's chromium package "
                    "(apt-get install -y chromium; scripts/test.sh installs it as root)")
    return found


@contextmanager
def launched_chromium() -> Iterator[Any]:
    """One Playwright-driven chromium: a module's tests share it (`scope="module"`), each
    in a context of its own, since a launch is ~5 CPU-s of the browser's and the driver's."""
    executable = chromium()
    sync_api = pytest.importorskip(
        "playwright.sync_api",
        reason="Playwright is not installed (a dev dependency: pip install playwright)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


# -- charts: their boxes, and what a resize must leave as it was ---------------------------

#: Every chart of the page (`[data-figure]`, drawn by airflow_ett/report/static/
#: ett-charts.js): its box and its drawing's (page coordinates), the plot area plotly gave
#: it and the one its spec gives it (the spec's height less its margins, from the page's
#: own figures), and whether it is drawn at its box's width.
CHARTS_JS = """() => Array.from(document.querySelectorAll('[data-figure]')).map(n => {
  const box = n.getBoundingClientRect(), full = n._fullLayout || null;
  const specs = JSON.parse(document.getElementById('ett-figures').textContent);
  const layout = specs[n.getAttribute('data-figure')].layout;
  const svg = n.querySelector('svg.main-svg');
  const drawn = svg ? svg.getBoundingClientRect() : null;
  return {key: n.getAttribute('data-figure'),
          top: box.top + scrollY, bottom: box.bottom + scrollY,
          left: box.left + scrollX, right: box.right + scrollX, height: box.height,
          drawnBottom: drawn ? drawn.bottom + scrollY : null,
          drawnRight: drawn ? drawn.right + scrollX : null,
          plotHeight: full ? full._size.h : null, plotWidth: full ? full._size.w : null,
          wantedPlot: layout.height - layout.margin.t - layout.margin.b,
          drawnWidth: n.getAttribute('data-drawn-width'),
          boxWidth: window.EttCharts ? EttCharts.contentWidth(n) : null};
})"""

#: The page's other blocks a chart must not draw over: its tables, headings, sections.
BLOCKS_JS = """() => Array.from(document.querySelectorAll('table, h1, h2, .kpi, footer'))
  .filter(n => n.getBoundingClientRect().height > 0).map(n => {
    const box = n.getBoundingClientRect();
    return {what: n.tagName.toLowerCase() + (n.id ? '#' + n.id : ''),
            top: box.top + scrollY, bottom: box.bottom + scrollY,
            left: box.left + scrollX, right: box.right + scrollX};
  })"""

#: True once every chart is drawn at its box's present width (after a resize, once the
#: redraw is done).
DRAWN_JS = """() => {
  const nodes = Array.from(document.querySelectorAll('[data-figure]'));
  return nodes.length > 0 && window.EttCharts !== undefined && nodes.every(n =>
    n.classList.contains('js-plotly-plot') &&
    n.getAttribute('data-drawn-width') === String(EttCharts.contentWidth(n)));
}"""


def wait_drawn(target: Any, timeout_ms: float = 30_000) -> list[dict[str, Any]]:
    """Wait until every chart of `target` (a Playwright page or frame) is drawn at its
    box's width; its charts (`CHARTS_JS`)."""
    target.wait_for_function(DRAWN_JS, timeout=timeout_ms)
    charts: list[dict[str, Any]] = target.evaluate(CHARTS_JS)
    return charts


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5
            and min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5)


def check_charts_hold(charts: list[dict[str, Any]], blocks: list[dict[str, Any]],
                      where: str) -> None:
    """Each chart (`CHARTS_JS`) has the plot height its spec gives it, its drawing stays
    inside its box, and no chart's box overlaps another chart or any of `blocks`
    (`BLOCKS_JS`)."""
    for chart in charts:
        key = chart["key"]
        assert chart["plotHeight"] is not None, f"{where}: {key} is not drawn"
        assert chart["plotHeight"] >= chart["wantedPlot"] - 1, (
            f"{where}: {key}'s plot is {chart['plotHeight']:.0f} px high, its spec gives "
            f"it {chart['wantedPlot']:.0f}")
        assert chart["drawnBottom"] <= chart["bottom"] + 0.5, (where, chart)
        assert chart["drawnRight"] <= chart["right"] + 0.5, (where, chart)
        for other in [*blocks, *(c for c in charts if c is not chart)]:
            assert not _overlap(chart, other), (
                f"{where}: chart {key} overlaps {other.get('what', other.get('key'))}")


#: Viewport sizes a resize test goes through: smaller, larger, narrow, then back.
RESIZES = ((1000, 800), (1600, 1000), (700, 900), (1900, 1100))


def check_resizes(page: Any, target: Any, where: str) -> list[dict[str, Any]]:
    """Resize `page`'s viewport through `RESIZES` and back to where it was; after each,
    once `target` (the page, or the frame holding the charts) has redrawn, its charts
    hold (`check_charts_hold`), and back at the first size every chart has the height it
    had. The charts as first measured."""
    size = page.viewport_size
    first = wait_drawn(target)
    check_charts_hold(first, target.evaluate(BLOCKS_JS), f"{where} at first")
    for width, height in (*RESIZES, (size["width"], size["height"])):
        page.set_viewport_size({"width": width, "height": height})
        charts = wait_drawn(target)
        check_charts_hold(charts, target.evaluate(BLOCKS_JS), f"{where} at {width}x{height}")
    again = {c["key"]: c["height"] for c in charts}
    for chart in first:
        assert abs(again[chart["key"]] - chart["height"]) <= 1, (
            f"{where}: {chart['key']} was {chart['height']:.0f} px high, "
            f"{again[chart['key']]:.0f} after the resizes")
    return first
