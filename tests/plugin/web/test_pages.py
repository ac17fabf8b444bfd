"""The HTML pages under TestClient: the numbers they show are the store's (formatted as the
report formats them), user strings are escaped, no script runs inline, errors are pages."""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape

from airflow_ett.plugin.web.app import CSP
from airflow_ett.plugin.web.data import DagScope
from airflow_ett.report import formatting as fmt
from airflow_ett.report import html as report
from airflow_ett.store import EttStore
from tests.plugin.web import fleet as F

Client = Callable[..., TestClient]
HTML = {"accept": "text/html,application/xhtml+xml"}


def _text(page: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', page)
    assert match, f"no #{element_id} in the page"
    return html.unescape(match.group(1)).strip()


def _scripts(page: str) -> list[str]:
    return re.findall(r"<script([^>]*)>", page)


def test_the_fleet_page_shows_the_stored_day(client: Client, fleet: F.Fleet) -> None:
    response = client().get("/?from=2026-11-26&to=2026-11-28", headers=HTML)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    # the headline: the last day with finished work, not the day of the running job alone
    page, last = response.text, fleet.days[-2]
    assert _text(page, "fleet-ett") == fmt.fmt_pct(last.fleet.ett_pct)
    assert _text(page, "fleet-jobs") == str(last.fleet.jobs)
    assert _text(page, "fleet-gpu-hours") == fmt.fmt_gpu_h(last.fleet.gpu_hours)
    assert _text(page, "fleet-lost") == fmt.fmt_gpu_h(last.fleet.gpu_hours_lost)
    # slow steps, inside effective training: the fleet's, and each tenant's beside its row
    assert last.fleet.gpu_hours_lost_to_slow_steps is not None
    assert _text(page, "fleet-slow-steps") == fmt.fmt_gpu_h(
        last.fleet.gpu_hours_lost_to_slow_steps)
    for name, g in last.tenants.items():
        cell = re.search(rf'data-tenant="{re.escape(str(escape(name)))}">.*?'
                         r'<td class="num" data-slow-steps>([^<]*)</td>', page)
        assert cell is not None and html.unescape(cell.group(1)) == fmt.fmt_slow_steps(
            g.gpu_hours_lost_to_slow_steps, g.slow_steps_pct_of_effective)
    delta = last.fleet.ett_pct - fleet.days[-3].fleet.ett_pct
    assert _text(page, "fleet-ett-delta") == f"{fmt.fmt_delta(delta)} vs 2026-11-26"
    for row in last.slo:
        assert f'data-component="{row.component}"' in page
        assert row.owner in page
    assert _text(page, "scope") == "all DAGs"
    # the worst run links to its run page, under where the app is mounted
    assert f'href="/runs/{F.DAG_A}/scheduled__a1"' in page
    for key in report.FLEET_FIGURES:
        assert f'data-figure="{key}"' in page


def test_the_fleet_page_escapes_user_strings(client: Client) -> None:
    page = client().get("/?from=2026-11-26&to=2026-11-26", headers=HTML).text
    assert F.MARKUP_TENANT not in page  # the tenant "<i>research</i>" (the CLI job's)
    assert html.escape(F.MARKUP_TENANT) in page


def test_pages_run_no_inline_script(client: Client) -> None:
    for path in ("/", f"/runs/{F.DAG_A}/scheduled__a1"):
        response = client().get(path, headers=HTML)
        assert response.headers["content-security-policy"] == CSP
        for attrs in _scripts(response.text):
            assert 'type="application/json"' in attrs or 'src="/static/' in attrs, attrs
        assert "script-src 'self'" in CSP and "'unsafe-inline'" not in CSP.split(";")[1]


def test_the_restricted_fleet_page_says_so(client: Client) -> None:
    scope = DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A}))
    page = client(scope=scope).get("/?from=2026-11-26&to=2026-11-28", headers=HTML).text
    assert _text(page, "scope") == "the 1 DAG(s) you may read"
    assert F.DAG_SECRET not in page and "search" not in page


def test_the_run_page_shows_the_runs_figures(client: Client, store: EttStore) -> None:
    page = client().get(f"/runs/{F.DAG_A}/scheduled__a1", headers=HTML).text
    summary = store.job_summary(f"{F.DAG_A}__scheduled__a1")
    assert _text(page, "run-ett") == fmt.fmt_pct(summary.ett_pct)
    assert _text(page, "run-e2e") == fmt.fmt_duration(summary.e2e_s)
    assert _text(page, "run-attempts") == "2" and _text(page, "run-nof") == "1"
    assert 'id="provisional"' not in page and "data-window" not in page
    assert F.MODEL_URI in page and 'id="model-after-release"' in page
    for component in summary.components:
        assert f'data-component="{component}"' in page
    assert 'data-figure="timeline"' in page
    assert f'href="/dags/{F.DAG_A}/runs/scheduled__a1" target="_top"' in page


def test_a_running_runs_page_has_its_rolling_windows(client: Client, store: EttStore,
                                                     fleet: F.Fleet,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ett.plugin.web import data

    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_WINDOWS", "5,90,60")
    run = data.run(store, F.DAG_A, fleet.running_run_id, now=fleet.now)
    assert run is not None and [w.minutes for w in run.windows] == [5, 60, 90]
    page = client().get(f"/runs/{F.DAG_A}/{fleet.running_run_id}", headers=HTML).text
    assert 'id="provisional"' in page
    assert _text(page, "run-ett") == fmt.fmt_pct(run.ett_pct)
    for w, label in zip(run.windows, ("5 min", "1 h", "90 min"), strict=True):
        # the headline, the Level-1 row, and a Level-2 column: each component's seconds
        # in the window and the window's E2E
        assert _text(page, f"run-window-{w.minutes}") == fmt.fmt_pct(w.ett_pct)
        assert f"ETT% last {label}</div>" in page
        assert f"<th class=\"num\">last {label}</th>" in page
        row = re.search(rf'data-metric="window-{w.minutes}"><td>([^<]*)</td><td[^>]*>([^<]*)<',
                        page)
        assert row is not None and row.group(1).startswith(f"last {label} (")
        assert row.group(2) == (f"ETT% {fmt.fmt_pct(w.ett_pct)} of "
                                f"{fmt.fmt_duration(w.e2e_s)}")
        cells = re.findall(rf'<td class="num" data-window="{w.minutes}">([^<]*)</td>', page)
        assert cells == [fmt.fmt_duration(w.components_s[c.component]) for c in run.level2
                         ] + [fmt.fmt_duration(w.e2e_s)]
    assert 'id="no-model"' in page


def test_errors_are_pages_for_a_browser_and_json_otherwise(client: Client) -> None:
    c = client(deny_runs=frozenset({F.DAG_SECRET}))
    missing = c.get(f"/runs/{F.DAG_A}/nope", headers=HTML)
    assert missing.status_code == 404 and 'data-status="404"' in missing.text
    assert "no ETT events recorded for run &#39;nope&#39;" in missing.text
    denied = c.get(f"/runs/{F.DAG_SECRET}/manual__b1", headers=HTML)
    assert denied.status_code == 403 and "Not allowed" in denied.text
    assert F.DAG_SECRET + "__manual__b1" not in denied.text  # nothing of the run shows
    as_json = c.get(f"/runs/{F.DAG_A}/nope")
    assert as_json.status_code == 404 and as_json.json()["detail"].startswith("no ETT")


def test_not_signed_in_is_a_styled_401_page_whose_sign_in_comes_back(store: EttStore) -> None:
    """Everything under /ett needs a login, its stylesheet too: the page carries its
    style inline and loads nothing; its sign-in is Airflow's, with `next` this page (as
    the browser asked for it), or the Airflow UI's page when this one is its iframe."""
    from urllib.parse import parse_qs, urlsplit

    from airflow_ett.plugin.web.app import create_app
    from tests.plugin.web.conftest import overridden

    c = TestClient(overridden(create_app(), store, user=None))
    asked = f"/runs/{F.DAG_A}/a%2Fb%3Fc?job=x%20y"
    page = c.get(asked, headers=HTML)
    assert page.status_code == 401 and "Not signed in" in page.text
    assert re.search(r"<style>[^<]*\.error \{", page.text), "the page's style is inline"
    assert "/static/" not in page.text and "<script" not in page.text
    link = re.search(r'<a class="button" id="sign-in" href="([^"]*)" target="_top">Sign in',
                     page.text)
    assert link, page.text
    href = urlsplit(html.unescape(link[1]))
    assert href.path == "/api/v2/auth/login"
    assert parse_qs(href.query) == {"next": [asked]}
    framed = c.get(asked, headers={**HTML, "sec-fetch-dest": "iframe",
                                   "referer": "http://testserver/dags/d/runs/r/plugin/ett"})
    assert parse_qs(urlsplit(html.unescape(re.search(
        r'id="sign-in" href="([^"]*)"', framed.text)[1])).query) == {
        "next": ["/dags/d/runs/r/plugin/ett"]}
    elsewhere = c.get(asked, headers={**HTML, "sec-fetch-dest": "iframe",
                                      "referer": "http://evil.example/x"})
    assert parse_qs(urlsplit(html.unescape(re.search(
        r'id="sign-in" href="([^"]*)"', elsewhere.text)[1])).query) == {"next": [asked]}


def test_a_bad_parameter_is_one_line_naming_it(client: Client) -> None:
    c = client()
    for path in ("/?from=2026-13-01", "/api/v1/fleet?from=yesterday",
                 f"/api/v1/runs/{F.DAG_A}/scheduled__a1?figures=maybe",
                 f"/runs/{F.DAG_A}/scheduled__a1?job={'j' * 1001}"):
        as_json = c.get(path)
        assert as_json.status_code == 422, path
        detail = as_json.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail, (path, detail)
        name = path.split("?")[1].split("=")[0]
        assert detail.startswith(f"{name}: "), (path, detail)
        if "/api/" not in path:
            page = c.get(path, headers=HTML)
            assert page.status_code == 422 and 'data-status="422"' in page.text
            assert str(escape(detail)) in page.text and "[{" not in page.text
            assert '<link rel="stylesheet" href="/static/ett.css">' in page.text
    assert c.get("/api/v1/fleet?from=yesterday").json()["detail"] == (
        "from: 'yesterday' is not a day YYYY-MM-DD (input should be a valid date or "
        "datetime, input is too short)")


def test_static_files(client: Client) -> None:
    c = client()
    bundle = c.get(f"/static/{report.PLOTLY_JS_NAME}")
    assert bundle.status_code == 200
    assert hashlib.sha256(bundle.content).hexdigest() == report.PLOTLY_JS_SHA256
    assert bundle.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert bundle.headers["content-type"].startswith("text/javascript")
    for name, kind in (("ett.js", "text/javascript"), ("ett-charts.js", "text/javascript"),
                       ("ett.css", "text/css"),
                       ("ett-icon.svg", "image/svg+xml"), ("ett-icon-dark.svg", "image/svg+xml")):
        response = c.get(f"/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
    for name in ("../app.py", "app.py", "%2e%2e%2fapp.py", "plotly.js"):
        assert c.get(f"/static/{name}").status_code == 404
    assert c.get("/api/v1/fleet").headers["cache-control"] == "no-store"


#: Run ids with the characters a URL gives a meaning to (Airflow's own pattern allows
#: `+` and `:`; a trainer or the CLI may send any). Not here: an id holding an escape
#: like `%2F`, which TestClient decodes twice (its path, then the path again): the browser
#: test (tests/plugin/web/test_pages_browser.py) follows such links through uvicorn.
ODD_RUN_IDS = ("manual/2026-11-28/a", "b?c=1&d=2", "e#f", "50%", "with space", "g+h",
               "i/../j", "trailing/", "/leading")


def odd_runs_store(tmp_path: Path) -> tuple[EttStore, str]:
    """A store whose last day's worst runs are jobs of `ODD_RUN_IDS` (rolled up)."""
    from airflow_ett.ett.synthetic import JobSpec, simulate
    from airflow_ett.jobs import job_id_for
    from airflow_ett.rollup import day_of, day_window, load_components
    from airflow_ett.store import upgrade

    url = f"sqlite:///{tmp_path / 'odd.db'}"
    upgrade(url)
    store = EttStore(url)
    for i, run_id in enumerate(ODD_RUN_IDS):
        store.insert_events(simulate(JobSpec(
            job=job_id_for(F.DAG_A, run_id), dag_id=F.DAG_A, run_id=run_id,
            submit_ts=F.NOW - 20_000 + 100 * i, queue_s=60.0 + 10 * i, world_size=8)))
    day = day_of(F.NOW, "UTC")
    store.daily.compute([day_window(day, "UTC")], load_components(), now=F.NOW)
    return store, day.isoformat()


def test_odd_run_ids_link_to_their_own_page(tmp_path: Path) -> None:
    """Every link to a run page (the worst runs, the JSON link on the run page) reaches
    the page of that run, whatever its id holds."""
    from airflow_ett.plugin.web.app import create_app
    from tests.plugin.web.conftest import overridden

    store, day = odd_runs_store(tmp_path)
    with store:
        c = TestClient(overridden(create_app(), store))
        page = c.get(f"/?from={day}&to={day}", headers=HTML).text
        links = dict(re.findall(r'<tr data-job="([^"]*)"><td class="id"><a href="([^"]*)">',
                                page))
        assert {html.unescape(job) for job in links} == {
            f"{F.DAG_A}__{run_id}" for run_id in ODD_RUN_IDS}
        for job, href in links.items():
            run_page = c.get(html.unescape(href), headers=HTML)
            assert run_page.status_code == 200, (job, href, run_page.text[:300])
            assert f'<span class="id">{job}</span>' in run_page.text, (job, href)
            json_link = re.search(r'<a href="([^"]*)">JSON</a>', run_page.text)
            assert json_link, job
            body = c.get(html.unescape(json_link[1])).json()
            assert body["job"] == html.unescape(job), (job, json_link[1])


def test_a_run_flagged_late_to_start_says_so_on_its_page_and_in_its_json(
        client: Client, store: EttStore, fleet: F.Fleet) -> None:
    from airflow_ett.ett.flags import time_to_start_flag
    from airflow_ett.jobs import job_id_for

    job = job_id_for(F.DAG_A, fleet.running_run_id)
    flag = time_to_start_flag(job, started=False, tenant="t", bound_s=600.0, queued_at=0.0,
                              now=900.0)
    assert flag is not None
    path = f"/runs/{F.DAG_A}/{fleet.running_run_id}"
    assert 'data-flag="' not in client().get(path, headers=HTML).text
    store.flags.raise_flag(flag)
    page = client().get(path, headers=HTML).text
    assert ('<li class="flag" data-flag="time_to_start">Flagged 1970-01-01 00:15:00 UTC: '
            f"{escape(flag.message)}</li>") in page
    body = client().get(f"/api/v1{path}").json()
    assert body["flags"] == [{"kind": "time_to_start", "at": 900.0, "message": flag.message,
                              "bound_s": 600.0, "waited_s": 900.0}]
    other = client().get(f"/api/v1/runs/{F.DAG_A}/scheduled__a1").json()
    assert other["flags"] == []


def test_the_run_page_shows_its_slow_steps(client: Client, store: EttStore) -> None:
    summary = store.job_summary(f"{F.DAG_A}__scheduled__a1")
    slow = summary.slow_steps
    assert slow is not None
    page = client().get(f"/runs/{F.DAG_A}/scheduled__a1", headers=HTML).text
    row = re.search(r'<tr data-metric="slow_steps"><td>([^<]*)</td><td class="num">([^<]*)<',
                    page)
    assert row is not None
    assert row.group(1) == ("slow steps (inside effective training; ideal step "
                            f"{fmt.fmt_step(slow.ideal_step_s)})")
    assert row.group(2) == (f"{fmt.fmt_duration(slow.lost_s)} "
                            f"({fmt.fmt_pct(slow.lost_pct_of_effective)}% of effective; "
                            f"{slow.slow_spans} of {slow.spans} spans slow)")
    body = client().get(f"/api/v1/runs/{F.DAG_A}/scheduled__a1").json()
    assert body["slow_steps"]["ideal_step_s"] == slow.ideal_step_s
    assert body["slow_steps"]["lost_s"] == slow.lost_s


def test_the_run_page_names_its_straggler_rank(client: Client, store: EttStore) -> None:
    import msgspec

    from tests.ett.test_stragglers import reports

    job = f"{F.DAG_A}__scheduled__a1"
    attempt = store.job_summary(job).attempts[0].attempt
    store.ingest(msgspec.structs.replace(e, job=job, id=f"pages-{e.id}")
                 for rank, own in ((0, 0.1), (1, 0.1), (2, 0.25))
                 for e in reports(rank, [own] * 5, attempt=attempt, wait_s=0.25 - own))
    ranks = store.job_summary(job).rank_steps
    assert ranks is not None
    (s,) = ranks.stragglers
    page = client().get(f"/runs/{F.DAG_A}/scheduled__a1", headers=HTML).text
    line = re.search(r'<p class="straggler" data-straggler="2">(.*?)</p>', page)
    assert line is not None
    assert html.unescape(re.sub(r"<[^>]+>", "", line.group(1))) == (
        f"straggler rank 2 of attempt {attempt}: {fmt.fmt_step(s.step_s)} a step of its own "
        f"against {fmt.fmt_step(s.others_step_s)} for the other ranks (2.50x), slower in "
        f"{fmt.fmt_pct(100.0)}% of its steps; the job waited {fmt.fmt_duration(s.lost_s)} "
        "for it")
    rows = re.findall(r'<tr data-rank="(\d+)"><td class="num">\d+( <span class="tag">'
                      r'straggler</span>)?</td><td class="num">([^<]*)</td>', page)
    assert [(r, bool(tag), step) for r, tag, step in rows] == [
        (str(x.rank), x.rank == 2, fmt.fmt_step(x.step_s)) for x in ranks.ranks]
    body = client().get(f"/api/v1/runs/{F.DAG_A}/scheduled__a1").json()
    assert body["rank_steps"]["stragglers"] == [msgspec.to_builtins(s)]
    assert [r["wait_step_s"] for r in body["rank_steps"]["ranks"]] == pytest.approx(
        [0.15, 0.15, 0.0])
    assert store.job_summary(f"{F.DAG_SECRET}__manual__b1").rank_steps is None
