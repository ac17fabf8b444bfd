"""The ETT pages through a real Airflow API server (`airflow api-server`, the plugin loaded
from its entry point), with a real auth manager: anonymous, admin, and a viewer who may
not read one DAG (tests/plugin/web/restricted_auth.py, a SimpleAuthManager that says no
for that DAG; tests/plugin/web/site.py sets it all up).

What it proves: Airflow mounts the app at /ett and every route answers 401 without a
login and 403 for a forged token (Airflow's own security code answering); an admin sees
the fleet exactly as the store's rollups say; the viewer's fleet is computed over the one
DAG they may read and shows nothing of the other; a run page of that other DAG is 403 for
them (JSON and HTML) and 200 for the admin; the numbers of the JSON routes are the ones
`airflow_ett.plugin.web.data` computes from the same store; the OpenAPI schema is served
and lists the routes; Airflow's plugin API lists the views and the app.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_ett.plugin.web import data
from airflow_ett.plugin.web.data import DagScope
from airflow_ett.store import EttStore
from tests.plugin.web import fleet as F
from tests.plugin.web.site import VIEWER, Site, ett_site, quote

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

HTML = {"Accept": "text/html"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with ett_site(tmp_path_factory.mktemp("ett-pages")) as s:
        yield s


@pytest.fixture(scope="module")
def tokens(site: Site) -> dict[str, str]:
    return {user: site.token(user) for user in ("admin", VIEWER)}


def _range(site: Site) -> str:
    return f"from={site.fleet.first.isoformat()}&to={site.fleet.last.isoformat()}"


def _running_began_yesterday(site: Site) -> int:
    """1 when the still-running job A2 was submitted before today (UTC): run between
    00:00 and 02:00, it touches day 2 as well as day 3."""
    from airflow_ett.rollup import day_window

    today = day_window(site.fleet.last, "UTC").lo
    return int(site.fleet.now - F.RUNNING_FOR_S < today)


def _expected_fleet(site: Site, scope: DagScope) -> object:
    with EttStore(site.store_url) as store:
        view = data.fleet(store, site.fleet.first, site.fleet.last, scope)
    return json.loads(view.model_dump_json())


def test_without_a_login_every_route_is_401(site: Site) -> None:
    paths = ["/ett/", f"/ett/runs/{F.DAG_A}/{quote(site.run_id)}", "/ett/api/v1/fleet",
             f"/ett/api/v1/runs/{F.DAG_A}/{quote(site.run_id)}", "/ett/openapi.json",
             "/ett/static/ett.js", "/ett/static/ett.css"]
    for path in paths:
        for headers in ({}, HTML):
            status, body = site.get(path, headers=headers)
            assert status == 401, (path, headers, body)
            assert F.DAG_A + "__" not in str(body)
        status, body = site.get(path, token="not.a.token")
        assert status == 403, (path, body)  # Airflow: "Invalid JWT token"


def test_the_admin_sees_the_stored_fleet(site: Site, tokens: dict[str, str]) -> None:
    status, body = site.get(f"/ett/api/v1/fleet?{_range(site)}", tokens["admin"])
    assert status == 200, body
    assert body == _expected_fleet(site, DagScope(all_dags=True))
    assert body["scope"] == {"all_dags": True, "readable_dags": None}
    stored = site.fleet.days
    assert [d["day"] for d in body["days"]] == [d.day for d in stored]
    # today has only the running job A2: the headline is the day before, with finished work
    assert body["latest"]["day"] == stored[-2].day
    assert body["latest"]["fleet"]["ett_pct"] == stored[-2].fleet.ett_pct
    assert [d["jobs"] for d in body["days"]] == [2, 2 + _running_began_yesterday(site), 1]
    day2 = stored[1].day
    status, body = site.get(f"/ett/api/v1/fleet?from={day2}&to={day2}", tokens["admin"])
    assert status == 200 and set(body["latest"]["tenants"]) == {"ads-ranking", "search"}


def test_the_viewer_sees_only_the_dags_they_may_read(site: Site,
                                                     tokens: dict[str, str]) -> None:
    status, body = site.get(f"/ett/api/v1/fleet?{_range(site)}&figures=true",
                            tokens[VIEWER])
    assert status == 200, body
    assert body["scope"] == {"all_dags": False, "readable_dags": 1}
    expected = _expected_fleet(site, DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A})))
    assert isinstance(expected, dict)
    assert body | {"figures": None} == expected
    assert set(body["figures"]) == {"ett_trend", "shares", "lost_by_team", "failures"}
    text = json.dumps(body)
    for hidden in (F.DAG_SECRET, "search", "two_tower", "cli-c1", "research"):
        assert hidden not in text, hidden
    assert [d["jobs"] for d in body["days"]] == [1, 1 + _running_began_yesterday(site), 1]
    status, page = site.get(f"/ett/?{_range(site)}", tokens[VIEWER], headers=HTML)
    assert status == 200 and F.DAG_SECRET not in page
    assert "the 1 DAG(s) you may read" in page


def test_run_pages_follow_the_dags_read_rights(site: Site, tokens: dict[str, str]) -> None:
    secret = f"{F.DAG_SECRET}/manual__b1"
    for path, headers in ((f"/ett/api/v1/runs/{secret}", {}), (f"/ett/runs/{secret}", HTML)):
        status, body = site.get(path, tokens[VIEWER], headers=headers)
        assert status == 403, (path, body)
        assert "search" not in str(body) and "two_tower" not in str(body)
        status, body = site.get(path, tokens["admin"], headers=headers)
        assert status == 200, (path, body)
    mine = f"/ett/api/v1/runs/{F.DAG_A}/scheduled__a1"
    assert site.get(mine, tokens[VIEWER])[0] == 200
    status, body = site.get(f"/ett/api/v1/runs/{F.DAG_A}/no_such_run", tokens[VIEWER])
    assert status == 404 and "no ETT events recorded" in body["detail"]


def test_the_running_run_under_its_real_airflow_run_id(site: Site,
                                                       tokens: dict[str, str]) -> None:
    # The run exists in Airflow (the UI's "ETT breakdown" tab sits on its page).
    assert site.af.run_state(F.DAG_A, site.run_id) in {"queued", "running"}
    status, body = site.get(f"/ett/api/v1/runs/{F.DAG_A}/{quote(site.run_id)}",
                            tokens[VIEWER])
    assert status == 200, body
    assert body["run_id"] == site.run_id and body["provisional"] is True
    with EttStore(site.store_url) as store:
        expected = data.run(store, F.DAG_A, site.run_id, now=body["now"])
    assert expected is not None
    assert body == json.loads(expected.model_dump_json())
    assert [w["minutes"] for w in body["windows"]] == [5, 15, 60]  # [ett] rolling_windows
    # each ends where the run does so far: `now`, to the microsecond
    assert {w["hi"] for w in body["windows"]} == {body["ended_at"]}
    assert body["ended_at"] == pytest.approx(body["now"], abs=1e-6)
    assert body["windows"][-1]["ett_pct"] != body["ett_pct"]  # the hour is not the run


def test_the_openapi_schema_is_served(site: Site, tokens: dict[str, str]) -> None:
    status, schema = site.get("/ett/openapi.json", tokens[VIEWER])
    assert status == 200, schema
    assert set(schema["paths"]) == {"/api/v1/fleet", "/api/v1/runs/{dag_id}/{run_id}",
                                    "/api/v1/compare"}
    assert schema["servers"] == [{"url": "/ett"}]
    assert "Fleet" in schema["components"]["schemas"]


def test_airflow_lists_the_views_and_the_app(site: Site, tokens: dict[str, str]) -> None:
    status, body = site.get("/api/v2/plugins", tokens["admin"])
    assert status == 200, body
    ours = next(p for p in body["plugins"] if p["name"] == "airflow_ett")
    assert [(v["name"], v["destination"], v["href"]) for v in ours["external_views"]] == [
        ("ETT", "nav", "/ett/"), ("ETT breakdown", "dag_run", "/ett/runs/{DAG_ID}/{RUN_ID}")]
    assert [(a["name"], a["url_prefix"]) for a in ours["fastapi_apps"]] == [("ETT", "/ett")]
    status, errors = site.get("/api/v2/plugins/importErrors", tokens["admin"])
    assert status == 200 and errors["import_errors"] == [], errors


def test_the_pages_serve_their_assets(site: Site, tokens: dict[str, str]) -> None:
    from airflow_ett.report.html import PLOTLY_JS_NAME

    status, page = site.get("/ett/", tokens["admin"], headers=HTML)
    assert status == 200 and 'id="fleet-ett"' in page
    for asset in (PLOTLY_JS_NAME, "ett-charts.js", "ett.js", "ett.css", "ett-icon.svg"):
        assert f'"/ett/static/{asset}"' in page, asset
        status, _ = site.get(f"/ett/static/{asset}", tokens["admin"], headers={"Accept": "*/*"})
        assert status == 200, asset
