"""The HTML pages under TestClient: the numbers they show are the store's (formatted as the
report formats them), user strings are escaped, no script runs inline, errors are pages."""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Callable

from fastapi.testclient import TestClient

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
    assert 'id="provisional"' not in page and 'id="run-last-hour"' not in page
    assert F.MODEL_URI in page and 'id="model-after-release"' in page
    for component in summary.components:
        assert f'data-component="{component}"' in page
    assert 'data-figure="timeline"' in page
    assert f'href="/dags/{F.DAG_A}/runs/scheduled__a1" target="_top"' in page


def test_a_running_runs_page_has_its_last_hour(client: Client, store: EttStore,
                                               fleet: F.Fleet) -> None:
    from airflow_ett.plugin.web import data

    run = data.run(store, F.DAG_A, fleet.running_run_id, now=fleet.now)
    assert run is not None and run.last_hour is not None
    page = client().get(f"/runs/{F.DAG_A}/{fleet.running_run_id}", headers=HTML).text
    assert 'id="provisional"' in page
    assert _text(page, "run-ett") == fmt.fmt_pct(run.ett_pct)
    assert _text(page, "run-last-hour") == fmt.fmt_pct(run.last_hour.ett_pct)
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


def test_not_signed_in_is_a_401_page(store: EttStore) -> None:
    from airflow_ett.plugin.web.app import create_app
    from tests.plugin.web.conftest import overridden

    c = TestClient(overridden(create_app(), store, user=None))
    page = c.get("/", headers=HTML)
    assert page.status_code == 401 and "Sign in to Airflow" in page.text
    assert 'href="/" target="_top"' in page.text


def test_static_files(client: Client) -> None:
    c = client()
    bundle = c.get(f"/static/{report.PLOTLY_JS_NAME}")
    assert bundle.status_code == 200
    assert hashlib.sha256(bundle.content).hexdigest() == report.PLOTLY_JS_SHA256
    assert bundle.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert bundle.headers["content-type"].startswith("text/javascript")
    for name, kind in (("ett.js", "text/javascript"), ("ett.css", "text/css"),
                       ("ett-icon.svg", "image/svg+xml"), ("ett-icon-dark.svg", "image/svg+xml")):
        response = c.get(f"/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
    for name in ("../app.py", "app.py", "%2e%2e%2fapp.py", "plotly.js"):
        assert c.get(f"/static/{name}").status_code == 404
    assert c.get("/api/v1/fleet").headers["cache-control"] == "no-store"
