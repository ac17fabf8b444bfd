"""The JSON API (`/ett/api/v1/...`, mounted here at the root) under TestClient, with the
access rules replaced by what each test says (conftest.py); its OpenAPI schema."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from airflow_ett.plugin.web.app import create_app
from airflow_ett.plugin.web.data import DagScope
from airflow_ett.store import EttStore
from tests.plugin.web import fleet as F
from tests.plugin.web.conftest import overridden

Client = Callable[..., TestClient]
RUN_A1 = f"/api/v1/runs/{F.DAG_A}/scheduled__a1"
RANGE = "from=2026-11-26&to=2026-11-28"


def test_the_fleet_as_stored(client: Client, fleet: F.Fleet) -> None:
    body = client().get(f"/api/v1/fleet?{RANGE}").json()
    last = fleet.days[-2]  # the newest day with finished work (the last has A2 running only)
    assert (body["first"], body["last"]) == ("2026-11-26", "2026-11-28")
    assert body["scope"] == {"all_dags": True, "readable_dags": None}
    assert [d["ett_pct"] for d in body["days"]] == [d.fleet.ett_pct for d in fleet.days]
    assert body["latest"]["fleet"]["ett_pct"] == last.fleet.ett_pct
    assert body["latest"]["fleet"]["gpu_hours"] == last.fleet.gpu_hours
    assert [s["component"] for s in body["latest"]["slo"]] == [s.component for s in last.slo]
    assert body["figures"] is None


def test_the_default_days_end_today(client: Client, fleet: F.Fleet) -> None:
    body = client().get("/api/v1/fleet").json()  # today = 2026-11-28 (conftest)
    assert (body["first"], body["last"]) == ("2026-11-15", "2026-11-28")
    assert len(body["days"]) == 3


def test_figures_on_request(client: Client) -> None:
    from airflow_ett.report.html import FLEET_FIGURES

    body = client().get(f"/api/v1/fleet?{RANGE}&figures=true").json()
    assert list(body["figures"]) == list(FLEET_FIGURES)
    assert body["figures"]["ett_trend"]["data"][0]["name"] == "fleet"


def test_a_restricted_user_gets_only_their_dags(client: Client) -> None:
    scope = DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A}))
    response = client(scope=scope).get(f"/api/v1/fleet?{RANGE}&figures=true")
    assert response.status_code == 200
    for hidden in (F.DAG_SECRET, "search", "two_tower", "cli-c1"):
        assert hidden not in response.text
    assert response.json()["scope"] == {"all_dags": False, "readable_dags": 1}


def test_bad_days_are_422(client: Client) -> None:
    c = client()
    reversed_ = c.get("/api/v1/fleet?from=2026-11-28&to=2026-11-01")
    assert reversed_.status_code == 422
    assert reversed_.json() == {"detail": "to: 2026-11-01 is before from: 2026-11-28"}
    assert c.get("/api/v1/fleet?from=2026-01-01&to=2026-12-31").status_code == 422
    malformed = c.get("/api/v1/fleet?from=yesterday")
    assert malformed.status_code == 422
    assert malformed.json()["detail"].startswith("from: 'yesterday' is not a day YYYY-MM-DD")


def test_an_empty_store(empty_store: EttStore) -> None:
    body = TestClient(overridden(create_app(), empty_store)).get("/api/v1/fleet").json()
    assert body["days"] == [] and body["latest"] is None
    assert body["notes"][0].startswith("No rollup is stored for 2026-11-15 to 2026-11-28")


def test_a_run(client: Client, store: EttStore) -> None:
    body = client().get(RUN_A1 + "?figures=true").json()
    summary = store.job_summary(f"{F.DAG_A}__scheduled__a1")
    assert body["job"] == summary.job and body["ett_pct"] == summary.ett_pct
    assert body["dag_id"] == F.DAG_A and body["run_id"] == "scheduled__a1"
    assert [a["attempt"] for a in body["attempts"]] == ["1", "2"]
    assert body["published"][0]["uri"] == F.MODEL_URI
    assert list(body["figures"]) == ["timeline"]


def test_a_running_run_has_its_rolling_windows(client: Client, store: EttStore,
                                               fleet: F.Fleet) -> None:
    from airflow_ett.ett.attribution import attribute_job, clip_to_window

    body = client().get(f"/api/v1/runs/{F.DAG_A}/{fleet.running_run_id}").json()
    assert body["provisional"] is True and body["now"] == fleet.now
    a = attribute_job(store.job_events(f"{F.DAG_A}__{fleet.running_run_id}"), now=fleet.now)
    assert [w["minutes"] for w in body["windows"]] == [5, 15, 60]
    for w in body["windows"]:
        clip = clip_to_window(a, fleet.now - 60 * w["minutes"], fleet.now)
        assert w == {"minutes": w["minutes"], "lo": clip.lo, "hi": fleet.now,
                     "e2e_s": clip.e2e_in_window_s, "ett_pct": clip.ett_pct,
                     "components_s": clip.components_s}
    assert client().get(RUN_A1).json()["windows"] == []  # a finished run has none


def test_a_run_id_with_url_characters(empty_store: EttStore) -> None:
    """The UI puts encodeURIComponent(run_id) in the view's href: `:` and `+` arrive
    encoded; the route must see the run id itself."""
    from airflow_ett.ett.synthetic import JobSpec, simulate
    from airflow_ett.jobs import job_id_for

    run_id = "manual__2026-11-28T10:00:00+00:00"
    empty_store.insert_events(simulate(JobSpec(job=job_id_for("ett_pages_odd", run_id),
                                               dag_id="ett_pages_odd", run_id=run_id,
                                               submit_ts=F.NOW - 5000)))
    client = TestClient(overridden(create_app(), empty_store))
    response = client.get("/api/v1/runs/ett_pages_odd/"
                          "manual__2026-11-28T10%3A00%3A00%2B00%3A00")
    assert response.status_code == 200, response.text
    assert response.json()["run_id"] == run_id


def test_runs_that_are_not_there_are_404(client: Client) -> None:
    c = client()
    missing = c.get(f"/api/v1/runs/{F.DAG_A}/no_such_run")
    assert missing.status_code == 404
    assert "no ETT events recorded for run 'no_such_run'" in missing.json()["detail"]
    # the same job id through another DAG's name (data.py's docstring)
    assert c.get(f"/api/v1/runs/{F.DAG_A}__scheduled/a1").status_code == 404


def test_a_run_of_a_dag_the_user_may_not_read_is_403(client: Client) -> None:
    c = client(deny_runs=frozenset({F.DAG_SECRET}))
    assert c.get(f"/api/v1/runs/{F.DAG_SECRET}/manual__b1").status_code == 403
    assert c.get(RUN_A1).status_code == 200


def test_a_store_that_cannot_be_read_is_503(tmp_path: Path) -> None:
    broken = EttStore(f"sqlite:///{tmp_path / 'never-migrated.db'}")
    c = TestClient(overridden(create_app(), broken))
    for path in ("/api/v1/fleet", RUN_A1):
        response = c.get(path)
        assert response.status_code == 503, response.text
        assert response.json()["detail"].startswith("the ETT store cannot be read: ")


def test_the_openapi_schema_lists_the_routes(client: Client) -> None:
    schema = client().get("/openapi.json").json()
    assert set(schema["paths"]) == {"/api/v1/fleet", "/api/v1/runs/{dag_id}/{run_id}",
                                    "/api/v1/compare"}
    fleet_op = schema["paths"]["/api/v1/fleet"]["get"]
    assert {p["name"] for p in fleet_op["parameters"]} == {"from", "to", "figures"}
    assert fleet_op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Fleet"}
    assert {"Fleet", "Run", "Day", "Group", "Level1"} <= set(schema["components"]["schemas"])
    window = schema["components"]["schemas"]["Window"]
    assert set(window["required"]) == {"minutes", "lo", "hi", "e2e_s", "ett_pct",
                                       "components_s"}
    assert schema["info"]["title"] == "airflow-ett"
    assert schema["servers"] == [{"url": "/"}]  # TestClient mounts the app at the root
