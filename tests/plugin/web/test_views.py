"""The plugin's `external_views`, checked against Airflow 3.3's own model of them and the
substitution its UI makes in `href` before loading a view's iframe."""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest
from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

from airflow_ett.plugin.web.views import base_path, external_views


def _ui_href(href: str, dag_id: str, run_id: str) -> str:
    """What Airflow's UI does for a view that is not `nav` (ui/dist, the external view
    component): `{DAG_ID}` and `{RUN_ID}` replaced by encodeURIComponent of each."""
    return (href.replace("{DAG_ID}", quote(dag_id, safe="-_.!~*'()"))
            .replace("{RUN_ID}", quote(run_id, safe="-_.!~*'()")))


def test_the_views_are_valid_for_airflow() -> None:
    nav, run = (ExternalViewResponse.model_validate(v) for v in external_views(""))
    assert (nav.name, nav.destination, nav.url_route, nav.href) == ("ETT", "nav", "ett", "/ett/")
    assert nav.nav_top_level is True
    assert (run.name, run.destination, run.url_route) == ("ETT breakdown", "dag_run",
                                                          "ett_breakdown")
    assert run.href == "/ett/runs/{DAG_ID}/{RUN_ID}"
    assert nav.icon == "/ett/static/ett-icon.svg"
    assert nav.icon_dark_mode == "/ett/static/ett-icon-dark.svg"


def test_the_run_view_lands_on_the_run_route() -> None:
    from starlette.routing import Match

    from airflow_ett.plugin.web.app import create_app

    run_id = "manual__2026-11-28T10:00:00+00:00"
    href = _ui_href(external_views("")[1]["href"], "ett_dlrm_demo", run_id)
    assert href == "/ett/runs/ett_dlrm_demo/manual__2026-11-28T10%3A00%3A00%2B00%3A00"
    page = next(r for r in create_app().routes if getattr(r, "name", "") == "run_page")
    match, child = page.matches({"type": "http", "method": "GET",
                                 "path": unquote(href.removeprefix("/ett"))})
    assert match is Match.FULL
    assert child["path_params"] == {"dag_id": "ett_dlrm_demo", "run_id": run_id}


@pytest.mark.parametrize(("base_url", "expected"), [
    ("/", ""), ("", ""), ("http://localhost:8080", ""), ("http://localhost:8080/", ""),
    ("https://airflow.example.com/airflow/", "/airflow"), ("/airflow", "/airflow"),
    ("/a/b/", "/a/b"),
])
def test_base_path(base_url: str, expected: str) -> None:
    assert base_path(base_url) == expected


def test_the_views_follow_airflows_base_path() -> None:
    nav, run = external_views("/airflow")
    assert nav["href"] == "/airflow/ett/"
    assert run["href"] == "/airflow/ett/runs/{DAG_ID}/{RUN_ID}"
    assert nav["icon"] == "/airflow/ett/static/ett-icon.svg"
