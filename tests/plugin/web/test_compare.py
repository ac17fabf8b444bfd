"""The comparison in the UI (`/ett/compare`, `/ett/api/v1/compare`) under TestClient, on the
hand-made fortnight of tests/rollup/compare_days.py: the CLI's figures, over the DAGs the
user may read, and a bad window as one line naming the parameter."""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Callable, Iterator

import msgspec
import pytest
from fastapi.testclient import TestClient
from markupsafe import escape
from pydantic import BaseModel

from airflow_ett.plugin.web import compare as web
from airflow_ett.plugin.web.app import create_app
from airflow_ett.plugin.web.data import DagScope
from airflow_ett.rollup import compare as rc
from airflow_ett.rollup import load_components
from airflow_ett.store import EttStore, upgrade
from tests.plugin.web.conftest import overridden
from tests.rollup.compare_days import store_days

WEEKS = "a=2026-11-01..2026-11-07&b=2026-11-08..2026-11-14"
TODAY = dt.date(2026, 11, 20)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('ett-compare') / 'ett.db'}"
    upgrade(store_url)
    with EttStore(store_url) as store:
        store_days(store, load_components())
    return store_url


@pytest.fixture
def client(url: str) -> Iterator[Callable[..., TestClient]]:
    with EttStore(url) as store:
        yield lambda **kw: TestClient(overridden(create_app(), store, today=TODAY, **kw))


def test_the_api_gives_the_clis_figures(client: Callable[..., TestClient]) -> None:
    body = client().get(f"/api/v1/compare?{WEEKS}").json()
    assert body["scope"] == {"all_dags": True, "readable_dags": None}
    assert body["fleet"]["change_points"] == pytest.approx(262_400 / 2_800 - 95.8)
    assert body["cohort"]["after"]["ett_pct"] == pytest.approx(96.0)
    assert [m["model"] for m in body["entered"]] == ["fresh"]
    assert [m["model"] for m in body["platform_changed"]] == ["rank"]


def test_by_default_the_last_stored_week_against_the_one_before(
        client: Callable[..., TestClient]) -> None:
    body = client().get("/api/v1/compare").json()
    assert body["before"] == {"first": "2026-11-01", "last": "2026-11-07", "days": 7}
    assert body["after"] == {"first": "2026-11-08", "last": "2026-11-14", "days": 7}


def test_a_restricted_user_compares_only_their_dags(client: Callable[..., TestClient]) -> None:
    scope = DagScope(all_dags=False, dag_ids=frozenset({"ctr", "rank"}))
    response = client(scope=scope).get(f"/api/v1/compare?{WEEKS}")
    body = response.json()
    assert body["scope"] == {"all_dags": False, "readable_dags": 2}
    assert "old" not in response.text and "fresh" not in response.text
    assert body["fleet"]["change_points"] == pytest.approx(96.0 - 97.25)  # the cohort's
    assert body["entered"] == [] and body["left"] == []


@pytest.mark.parametrize(("query", "detail"), [
    ("a=2026-11-07..2026-11-01", "a: '2026-11-07..2026-11-01': its first day 2026-11-07 is "
                                 "after its last 2026-11-01"),
    ("b=yesterday", "b: 'yesterday': 'yesterday' is not a date (YYYY-MM-DD); a window is "
                    "D1..D2"),
    ("a=2026-10-30..2026-11-07&b=2026-11-08..2026-11-14",
     "a: 2026-10-30..2026-11-07: 2 of its 9 days not rolled up (2026-10-30, 2026-10-31): "
     "run `airflow-ett rollup --from 2026-10-30 --to 2026-10-31` first"),
])
def test_a_bad_window_is_422_naming_it(client: Callable[..., TestClient], query: str,
                                       detail: str) -> None:
    c = client()
    response = c.get(f"/api/v1/compare?{query}")
    assert (response.status_code, response.json()) == (422, {"detail": detail})
    page = c.get(f"/compare?{query}", headers={"accept": "text/html"})
    assert page.status_code == 422 and str(escape(detail)) in page.text


def test_the_page_shows_the_tables(client: Callable[..., TestClient]) -> None:
    page = client().get(f"/compare?{WEEKS}", headers={"accept": "text/html"})
    assert page.status_code == 200
    text = page.text
    assert 'id="fleet-change">-2.09 points' in text
    assert 'id="cohort-change">-1.25 points' in text
    assert 'data-model="rank" data-change="platform"' in text
    assert 'id="cohort-models"' in text  # the cohort's own tables: models came and went
    assert 'data-component="initialization"' in text
    fleet_page = client().get("/?from=2026-11-08&to=2026-11-14",
                              headers={"accept": "text/html"})
    assert 'id="compare-link"' in fleet_page.text


def test_without_churn_the_page_shows_one_view(client: Callable[..., TestClient]) -> None:
    page = client().get("/compare?a=2026-11-01..2026-11-03&b=2026-11-04..2026-11-07",
                        headers={"accept": "text/html"})
    assert page.status_code == 200
    assert 'id="fleet-models"' in page.text and 'id="cohort-models"' not in page.text
    assert "the fixed cohort is the fleet as operated" in page.text


@pytest.mark.parametrize(("struct", "model"), [
    (rc.Span, web.Span), (rc.Side, web.Side), (rc.ComponentMove, web.ComponentMove),
    (rc.GroupMove, web.GroupMove), (rc.View, web.View), (rc.ModelChange, web.ModelChange),
    (rc.Churn, web.Churn), (rc.Comparison, web.Comparison),
])
def test_the_api_models_mirror_the_structs(struct: type[msgspec.Struct],
                                           model: type[BaseModel]) -> None:
    fields = set(struct.__struct_fields__)
    extra = {"scope"} if model is web.Comparison else set()
    assert set(model.model_fields) == fields | extra
    hints = typing.get_type_hints(struct)
    for name in fields:
        # the same type, by name (the models are pydantic's mirror classes of the structs)
        assert str(hints[name]).replace("airflow_ett.rollup.compare.", "") == str(
            model.model_fields[name].annotation).replace("airflow_ett.plugin.web.compare.",
                                                         ""), name
