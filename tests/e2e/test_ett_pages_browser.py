"""The ETT pages inside the real Airflow UI, in a real headless Chromium (Debian's
`chromium`, driven by Python Playwright with `executable_path`; Playwright's own browser
download is never used), against the API server of tests/plugin/web/site.py.

In the light and the dark colour scheme (Airflow's UI follows the system's by default):
log in through Airflow's own login page; open the "ETT" entry of Airflow's navigation and
check, inside the UI's iframe, that the fleet page shows the store's figures, that its four
charts are drawn and that it took the UI's theme; open the run's page in Airflow, its
"ETT breakdown" tab, and check the run's figures against `airflow_ett.plugin.web.data`
computed from the same store at the page's own `now`. Resize the window, smaller and
larger, with the pages in the UI's iframe and alone: every chart keeps its plot's height
and stays off the tables (tests/browser.py `check_resizes`). Then switch the UI's theme
under a loaded page and see the page follow. No request may leave 127.0.0.1, no console
error, CSP report or dialog may come from the ETT pages.

Then, as a person who is not signed in: a link to a run page gives the "Not signed in"
page, whose sign-in (Airflow's own) brings them back to that page. Last, the running
job's tab, open in the UI, shows the job's end when the store gets it, without a reload.

Screenshots (look at them): `$ETT_TEST_ARTIFACTS/pages/` (default tests/artifacts/pages/):
ui-fleet-<scheme>.png and ui-run-<scheme>.png (the Airflow UI with the page in its iframe),
ett-fleet-<scheme>.png and ett-run-<scheme>.png (the pages alone, full length).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.plugin.web import data
from airflow_ett.report import html as report
from airflow_ett.store import EttStore
from tests.browser import artifacts_dir, check_resizes, launched_chromium, wait_drawn
from tests.plugin.web import fleet as F
from tests.plugin.web.site import Site, ett_site, quote

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

WAIT_MS = 60_000




@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with ett_site(tmp_path_factory.mktemp("ett-pages-browser")) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as launched:
        yield launched


class Watch:
    """What the ETT pages did wrong in one browser context: console errors (a CSP
    violation is one), uncaught exceptions, dialogs, requests that left the machine."""

    def __init__(self, context: Any, page: Any) -> None:
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.dialogs: list[str] = []

        def console(message: Any) -> None:
            where = (message.location or {}).get("url", "")
            if message.type == "error" and "/ett/" in where:
                self.errors.append(f"{where}: {message.text}")

        def route(r: Any) -> None:
            if r.request.url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")):
                r.continue_()
            else:
                self.outside.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page.on("console", console)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def check(self) -> None:
        assert not self.errors, self.errors
        assert not self.outside, self.outside
        assert not self.dialogs, self.dialogs


def _login(page: Any, site: Site, user: str) -> None:
    page.goto(site.url + "/")
    page.wait_for_selector("input[name=username]", timeout=WAIT_MS)  # Airflow's login page
    assert "/auth/login" in page.url
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", site.password(user))
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="ETT").wait_for(timeout=WAIT_MS)


def _ett_frame(page: Any, marker: str) -> Any:
    """The UI's iframe whose ETT page has `marker` (an element id) drawn."""
    page.wait_for_function(
        "m => Array.from(document.querySelectorAll('iframe')).some(f => "
        "f.contentDocument && f.contentDocument.getElementById(m))", arg=marker,
        timeout=WAIT_MS)
    frame = next(f for f in page.frames if "/ett/" in f.url)
    frame.wait_for_function(
        "() => document.querySelectorAll('[data-figure]').length > 0 && "
        "document.querySelectorAll('[data-figure]').length === "
        "document.querySelectorAll('.js-plotly-plot').length", timeout=WAIT_MS)
    return frame


def _text(frame: Any, selector: str) -> str:
    return str(frame.locator(selector).first.inner_text()).strip()


def _check_fleet(frame: Any, site: Site) -> None:
    # the headline: yesterday, the newest day with finished work (today has only the
    # running job A2, decision 0010)
    with EttStore(site.store_url) as store:
        last = store.daily.day(site.fleet.days[-2].day)
    assert last is not None and last == site.fleet.days[-2]
    assert site.fleet.days[-1].nothing_finished
    assert _text(frame, "#fleet-ett") == report.fmt_pct(last.fleet.ett_pct)
    assert _text(frame, "#fleet-jobs") == f"{last.fleet.jobs:,}"
    assert _text(frame, "#fleet-gpu-hours") == report.fmt_gpu_h(last.fleet.gpu_hours)
    assert _text(frame, "#fleet-lost") == report.fmt_gpu_h(last.fleet.gpu_hours_lost)
    for row in last.slo:
        cell = f'tr[data-component="{row.component}"] td[data-share]'
        assert _text(frame, cell) == f"{report.fmt_pct(row.share_pct)}%", row.component
    plotted = frame.evaluate("() => Array.from(document.querySelectorAll('[data-figure]'))"
                             ".map(n => [n.getAttribute('data-figure'), "
                             "(n._fullData || []).length])")
    assert [k for k, _ in plotted] == list(report.FLEET_FIGURES)
    assert all(n > 0 for _, n in plotted), plotted


def _check_run(frame: Any, site: Site) -> None:
    now = float(frame.locator("header[data-now]").get_attribute("data-now"))
    with EttStore(site.store_url) as store:
        run = data.run(store, F.DAG_A, site.run_id, now=now)
    assert run is not None and run.provisional and run.windows
    assert _text(frame, "#run-ett") == report.fmt_pct(run.ett_pct)
    for w in run.windows:
        assert _text(frame, f"#run-window-{w.minutes}") == report.fmt_pct(w.ett_pct)
    assert _text(frame, "#run-e2e") == report.fmt_duration(run.e2e_s)
    assert _text(frame, "#run-attempts") == str(run.level1.attempts)
    for c in run.level2:
        cell = f'#level2 tr[data-component="{c.component}"] td[data-share]'
        assert _text(frame, cell) == f"{report.fmt_pct(c.share_pct)}%", c.component
    assert frame.locator("#provisional").count() == 1


def _theme(frame: Any) -> str:
    return str(frame.evaluate("() => document.documentElement.getAttribute('data-theme')"))


def test_the_ett_pages_in_the_airflow_ui(site: Site, browser: Any) -> None:
    out = artifacts_dir("pages")
    for scheme in ("light", "dark"):
        _one_scheme(browser, site, scheme, out)
    for name in ("ui-fleet", "ui-run", "ett-fleet", "ett-run"):
        for scheme in ("light", "dark"):
            assert (out / f"{name}-{scheme}.png").stat().st_size > 30_000, name


def _one_scheme(browser: Any, site: Site, scheme: str, out: Path) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 1000},
                                  color_scheme=scheme, service_workers="block")
    page = context.new_page()
    watch = Watch(context, page)
    try:
        _login(page, site, "admin")
        # The "ETT" entry of Airflow's navigation: the fleet page in the UI's iframe.
        page.get_by_role("link", name="ETT").click()
        page.wait_for_url("**/plugin/ett**", timeout=WAIT_MS)
        frame = _ett_frame(page, "fleet-ett")
        _check_fleet(frame, site)
        assert _theme(frame) == scheme
        page.screenshot(path=str(out / f"ui-fleet-{scheme}.png"))
        check_resizes(page, frame, f"the fleet page in the UI ({scheme})")
        page.screenshot(path=str(out / f"ui-fleet-{scheme}-resized.png"))

        # The run's page in Airflow, its "ETT breakdown" tab.
        page.goto(f"{site.url}/dags/{F.DAG_A}/runs/{quote(site.run_id)}")
        page.get_by_role("link", name="ETT breakdown").click()
        page.wait_for_url("**/plugin/ett_breakdown**", timeout=WAIT_MS)
        frame = _ett_frame(page, "run-ett")
        _check_run(frame, site)
        assert _theme(frame) == scheme
        page.screenshot(path=str(out / f"ui-run-{scheme}.png"))
        check_resizes(page, frame, f"the run tab in the UI ({scheme})")

        # The UI switches theme (next-themes swaps the class on its <html>): the page follows.
        other = "dark" if scheme == "light" else "light"
        page.evaluate(f"document.documentElement.classList.replace('{scheme}', '{other}')")
        frame.wait_for_function(f"() => document.documentElement.dataset.theme === '{other}'",
                                timeout=WAIT_MS)
        colour = frame.evaluate("() => document.querySelector('[data-figure]')"
                                "._fullLayout.font.color")
        assert colour == report.THEMES[other]["layout"]["font"]["color"]

        # The pages alone, full length, for a reader of the screenshots.
        for name, path in (("ett-fleet", "/ett/"),
                           ("ett-run", f"/ett/runs/{F.DAG_A}/{quote(site.run_id)}")):
            page.goto(site.url + path)
            wait_drawn(page, WAIT_MS)
            page.screenshot(path=str(out / f"{name}-{scheme}.png"), full_page=True)
            check_resizes(page, page, f"{path} alone ({scheme})")
    finally:
        context.close()
    watch.check()


def test_signing_in_from_the_not_signed_in_page_comes_back(site: Site, browser: Any) -> None:
    """A person given a link to a run's page, not signed in: the page says so, in the
    pages' style; its sign-in is Airflow's login, and after it they are on that page."""
    out = artifacts_dir("pages")
    path = f"/ett/runs/{F.DAG_A}/{quote(site.run_id)}"
    context = browser.new_context(viewport={"width": 1280, "height": 800},
                                  service_workers="block")
    page = context.new_page()
    watch = Watch(context, page)
    try:
        response = page.goto(site.url + path)
        assert response is not None and response.status == 401
        assert page.locator("h1").inner_text() == "Not signed in"
        assert page.evaluate("() => getComputedStyle(document.querySelector('.error'))"
                             ".borderTopStyle") == "solid"  # the pages' style
        page.screenshot(path=str(out / "not-signed-in.png"))
        page.locator("#sign-in").click()
        page.wait_for_selector("input[name=username]", timeout=WAIT_MS)
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", site.password("admin"))
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("#run-ett", timeout=WAIT_MS)  # back on the run's page
        assert page.url == site.url + path
        wait_drawn(page, WAIT_MS)
    finally:
        context.close()
    # the browser logs the page's own 401; the page loads nothing else that would fail
    # (everything under /ett needs a login)
    watch.errors = [e for e in watch.errors if not e.startswith(
        f"{site.url}{path}: Failed to load resource: the server responded with a status "
        "of 401")]
    watch.check()


def test_a_running_runs_tab_shows_its_end_without_a_reload(site: Site, browser: Any) -> None:
    """The still-running job's "ETT breakdown" tab, open in the UI: the store gets the rest
    of the job's events (it ends), and the tab shows it, the UI not reloaded."""
    import dataclasses

    from airflow_ett.ett.synthetic import simulate

    out = artifacts_dir("pages")
    running = next(s for s in F.specs(site.fleet.lo1, site.fleet.now, site.run_id)
                   if s.run_id == site.run_id)
    assert running.running_until_step is not None
    context = browser.new_context(viewport={"width": 1440, "height": 1000},
                                  service_workers="block")
    page = context.new_page()
    watch = Watch(context, page)
    try:
        _login(page, site, "admin")
        page.goto(f"{site.url}/dags/{F.DAG_A}/runs/{quote(site.run_id)}")
        page.get_by_role("link", name="ETT breakdown").click()
        page.wait_for_url("**/plugin/ett_breakdown**", timeout=WAIT_MS)
        frame = _ett_frame(page, "run-ett")
        assert frame.locator("#provisional").count() == 1
        page.evaluate("() => { window.__notReloaded = true; }")
        with EttStore(site.store_url) as store:
            store.insert_events(simulate(dataclasses.replace(running,
                                                             running_until_step=None)))
        frame.wait_for_selector("#provisional", state="detached", timeout=WAIT_MS)
        assert page.evaluate("() => window.__notReloaded === true")
        assert frame.locator("header[data-refresh-s]").count() == 0
        wait_drawn(frame, WAIT_MS)
        page.screenshot(path=str(out / "ui-run-ended.png"))
    finally:
        context.close()
    watch.check()
