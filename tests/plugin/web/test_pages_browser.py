"""The ETT pages on their own, as a person uses them, in a real headless Chromium (Debian's
`chromium`, driven by Playwright with `executable_path`), served by uvicorn on 127.0.0.1:
the app of `create_app()` with Airflow's login replaced as conftest.py replaces it, on a
store of tests/plugin/web/fleet.py's jobs, jobs whose run ids hold URL characters, and a
job still running. (tests/e2e/test_ett_pages_browser.py sees the same pages inside the
real Airflow UI.)

- Resizing the window, smaller and larger, leaves every chart of the fleet page and of a
  run page its plot's height, inside its box and off the tables (tests/browser.py).
- A running job's page shows what the store learns without a reload: the job ends, and
  the page says so, with the charts drawn in place.
- Each link of the worst runs opens the page of that run, whatever its run id holds, and
  that page's JSON link gives that run's JSON.
- Not signed in, the page is styled like the others and links to Airflow's sign-in.

Screenshots (look at them): `$ETT_TEST_ARTIFACTS/pages-alone/` (default
tests/artifacts/pages-alone/).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from airflow_ett.ett.events import AttemptEnded
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.jobs import job_id_for
from airflow_ett.rollup import day_of, day_window, load_components
from airflow_ett.store import EttStore, upgrade
from tests.browser import artifacts_dir, check_resizes, launched_chromium, wait_drawn
from tests.plugin.web import fleet as F

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

WAIT_MS = 60_000
#: Run ids with the characters a URL gives a meaning to; `k%2Fl` holds an escape itself.
ODD_RUN_IDS = ("manual/2026-11-28/a", "b?c=1&d=2", "e#f", "50%", "with space", "g+h",
               "i/../j", "k%2Fl", "/leading")
#: A preempted job, and the reason its first attempt's end gave (the controller's).
PREEMPTED = JobSpec(job=job_id_for(F.DAG_A, "manual__victim"), dag_id=F.DAG_A,
                    run_id="manual__victim", submit_ts=F.NOW - 9000, world_size=8,
                    steps=300, step_s=10.0, progress_every=10, checkpoint_every=50,
                    failures=(InjectedFailure(at_step=120, cause="preemption",
                                              reschedule_s=300.0),))
REASON = ("left at its checkpoint on request: preempted ett_pages_ranking__manual__victim: "
          "tenant <batch> over its guarantee by 2 GPUs, checkpointed 40 s ago, unsaved "
          "work 40 s x 8 GPUs, for ads_ranker__manual__1 (priority 100 over 10); yields at "
          "its next checkpoint")
#: The job still running whose page the refresh test watches end.
LIVE = JobSpec(job=job_id_for(F.DAG_A, "manual__live"), dag_id=F.DAG_A,
               run_id="manual__live", submit_ts=F.NOW - 3600, queue_s=30.0, world_size=8,
               steps=4000, step_s=5.0, progress_every=20, checkpoint_every=200)


@dataclass
class Server:
    url: str
    store_url: str


def _seed(url: str) -> None:
    with EttStore(url) as store:
        F.seed(store, F.LO1, F.NOW)
        for i, run_id in enumerate(ODD_RUN_IDS):
            store.insert_events(simulate(JobSpec(
                job=job_id_for(F.DAG_A, run_id), dag_id=F.DAG_A, run_id=run_id,
                submit_ts=F.NOW - 30_000 + 100 * i, queue_s=900.0 + 10 * i, world_size=8)))
        store.insert_events(simulate(_live(running=True)))
        store.insert_events([msgspec.structs.replace(e, message=REASON)
                             if isinstance(e, AttemptEnded) and e.cause == "preemption"
                             else e for e in simulate(PREEMPTED)])
        store.insert_events(_rank_reports())
        store.daily.compute([day_window(day_of(F.NOW, "UTC"), "UTC")], load_components(),
                            now=F.NOW)


def _rank_reports() -> list[Any]:
    """Each rank's own step times for the preempted job's second attempt: rank 5 slow."""
    from tests.ett.test_stragglers import reports

    return [msgspec.structs.replace(e, job=PREEMPTED.job, id=f"{PREEMPTED.job}.{e.id}")
            for rank in range(8)
            for e in reports(rank, [0.1] + [0.14 if rank == 5 else 0.1] * 6, attempt="2",
                             wait_s=0.0 if rank == 5 else 0.04)]


def _live(*, running: bool) -> JobSpec:
    from dataclasses import replace

    return replace(LIVE, running_until_step=300 if running else None)


@contextlib.contextmanager
def _serve(app: Any) -> Iterator[str]:
    """`app` on a free port of 127.0.0.1, in a thread, until the block ends."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            thread.join(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from airflow_ett.plugin.web.app import create_app
    from tests.plugin.web.conftest import overridden

    url = f"sqlite:///{tmp_path_factory.mktemp('ett-pages-alone') / 'ett.db'}"
    upgrade(url)
    _seed(url)
    with EttStore(url) as store, _serve(overridden(create_app(), store)) as base:
        yield Server(url=base, store_url=url)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as launched:
        yield launched


@contextlib.contextmanager
def _page(browser: Any, scheme: str = "light") -> Iterator[Any]:
    """A page in its own context; afterwards, no console error, page error or dialog."""
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  color_scheme=scheme, service_workers="block")
    page = context.new_page()
    errors: list[str] = []
    def console(message: Any) -> None:
        where = (message.location or {}).get("url", "")
        # the browser's own ask for /favicon.ico (the JSON view has no icon) is no page's
        if message.type == "error" and not where.endswith("/favicon.ico"):
            errors.append(f"{where}: {message.text}")

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (errors.append(f"dialog: {d.message}"), d.dismiss()))
    try:
        yield page
    finally:
        context.close()
    assert not errors, errors


def _out() -> Path:
    return artifacts_dir("pages-alone")


def _day() -> str:
    return day_of(F.NOW, "UTC").isoformat()


def test_charts_keep_their_size_when_the_window_is_resized(server: Server,
                                                           browser: Any) -> None:
    first = (dt.date.fromisoformat(_day()) - dt.timedelta(days=2)).isoformat()
    for name, path in (("fleet", f"/?from={first}&to={_day()}"),
                       ("run", f"/runs/{F.DAG_A}/scheduled__a1")):
        for scheme in ("light", "dark"):
            with _page(browser, scheme) as page:
                page.goto(server.url + path)
                charts = check_resizes(page, page, f"the {name} page ({scheme})")
                assert charts, name
                page.screenshot(path=str(_out() / f"{name}-{scheme}-resized.png"),
                                full_page=True)


def test_a_running_jobs_page_shows_its_end_without_a_reload(server: Server,
                                                            browser: Any) -> None:
    with _page(browser) as page:
        page.goto(f"{server.url}/runs/{F.DAG_A}/manual__live")
        wait_drawn(page)
        assert page.locator("#provisional").count() == 1
        assert page.locator("header[data-refresh-s]").count() == 1
        # marks a reload would lose: one on the window, one on the drawn chart
        page.evaluate("() => { window.__notReloaded = true; "
                      "document.querySelector('[data-figure]').__sameChart = true; }")
        page.screenshot(path=str(_out() / "live-running.png"), full_page=True)

        with EttStore(server.store_url) as store:  # the rest of the job: it ends
            store.insert_events(simulate(_live(running=False)))
        page.wait_for_selector("#provisional", state="detached", timeout=WAIT_MS)

        assert page.evaluate("() => window.__notReloaded === true")
        assert page.evaluate("() => document.querySelector('[data-figure]').__sameChart")
        assert page.locator("header[data-refresh-s]").count() == 0  # it stops asking
        assert page.locator("#attempts tr[data-attempt] td").nth(4).inner_text() == "success"
        charts = wait_drawn(page)
        timeline = json.loads(page.locator("#ett-figures").text_content() or "{}")["timeline"]
        shown = page.evaluate("() => document.querySelector('[data-figure]')._fullData"
                              ".map(t => t.name)")
        assert shown == [t["name"] for t in timeline["data"]]  # redrawn with the new figures
        assert charts[0]["plotHeight"] >= charts[0]["wantedPlot"] - 1
        page.screenshot(path=str(_out() / "live-ended.png"), full_page=True)


def test_a_preempted_runs_page_shows_the_reason(server: Server, browser: Any) -> None:
    with _page(browser) as page:
        page.goto(f"{server.url}/runs/{F.DAG_A}/manual__victim")
        wait_drawn(page)
        row = page.locator('#attempts tr[data-attempt-message="1"]')
        assert row.inner_text().strip() == REASON  # shown as text, markup and all
        assert row.is_visible()
        straggler = page.locator('#ranks p[data-straggler="5"]')
        assert straggler.is_visible()
        assert straggler.inner_text().startswith("straggler rank 5 of attempt 2: ")
        assert page.locator("#ranks tr[data-rank]").count() == 8
        page.screenshot(path=str(_out() / "run-preempted.png"), full_page=True)


def test_each_worst_run_links_to_its_own_page(server: Server, browser: Any) -> None:
    with _page(browser) as page:
        fleet = f"{server.url}/?from={_day()}&to={_day()}"
        page.goto(fleet)
        jobs = page.eval_on_selector_all("#top-runs tr[data-job]",
                                         "rows => rows.map(r => r.getAttribute('data-job'))")
        odd = {job_id_for(F.DAG_A, run_id) for run_id in ODD_RUN_IDS}
        assert odd <= set(jobs), jobs
        for i, job in enumerate(jobs):
            link = page.locator("#top-runs tr[data-job]").nth(i).locator("a")
            if link.count() == 0:
                continue  # a job of no DAG run (the CLI's) has no run page
            link.click()
            page.wait_for_load_state()
            assert page.locator("h1 .id").inner_text() == job, (job, page.url)
            page.get_by_role("link", name="JSON").click()
            page.wait_for_load_state()
            assert json.loads(page.locator("body").inner_text())["job"] == job, page.url
            page.goto(fleet)


def test_not_signed_in_is_a_styled_page_with_a_sign_in(server: Server, browser: Any) -> None:
    from airflow_ett.plugin.web.app import create_app
    from tests.plugin.web.conftest import overridden

    path = f"/runs/{F.DAG_A}/manual%2Fodd?job=x"
    with EttStore(server.store_url) as store, \
            _serve(overridden(create_app(), store, user=None)) as anonymous:
        for scheme in ("light", "dark"):
            context = browser.new_context(viewport={"width": 1000, "height": 600},
                                          color_scheme=scheme)
            try:
                page = context.new_page()
                requests: list[str] = []
                page.on("request", lambda r, asked=requests: asked.append(r.url))
                response = page.goto(anonymous + path)
                assert response is not None and response.status == 401
                box = page.evaluate("() => { const s = getComputedStyle("
                                    "document.querySelector('.error')); return "
                                    "[s.borderTopStyle, s.borderRadius, s.maxWidth]; }")
                assert box == ["solid", "8px", "720px"], box  # ett.css applies
                href = page.locator("#sign-in").get_attribute("href")
                assert href == "/api/v2/auth/login?next=%2Fruns%2Fett_pages_ranking%2Fmanual" \
                               "%252Fodd%3Fjob%3Dx", href
                assert requests == [anonymous + path]  # nothing it would need a login for
                page.screenshot(path=str(_out() / f"not-signed-in-{scheme}.png"))
            finally:
                context.close()


def test_the_compare_page_says_what_moved_between_two_days(server: Server,
                                                           browser: Any) -> None:
    before = (dt.date.fromisoformat(_day()) - dt.timedelta(days=1)).isoformat()
    for scheme in ("light", "dark"):
        with _page(browser, scheme) as page:
            page.goto(f"{server.url}/compare?a={before}..{before}&b={_day()}..{_day()}")
            assert page.locator("#fleet-ett").is_visible()
            assert page.locator("#fleet-change").inner_text().endswith(" points")
            assert page.locator("#fleet-components tr[data-component]").count() == 5  # lost
            page.screenshot(path=str(_out() / f"compare-{scheme}.png"), full_page=True)
