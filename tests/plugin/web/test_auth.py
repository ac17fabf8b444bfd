"""Every route of the app needs Airflow's signed-in user, and the fleet and run routes carry
Airflow's own DAG access dependencies; without credentials each one answers 401.

Here Airflow's `get_user` is left in place (only the store is replaced): with no bearer
token and no `_token` cookie it answers 401 before it asks any auth manager. The real
API server, real tokens and a restricted user: tests/e2e/test_ett_pages.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from airflow_ett.plugin.web import access
from airflow_ett.plugin.web.app import create_app
from airflow_ett.store import EttStore
from tests.plugin.web import fleet as F

#: One request per route, path parameters filled in.
PATHS = {
    "/": "/",
    "/runs/{dag_id}/{run_id:path}": f"/runs/{F.DAG_A}/scheduled__a1",
    "/api/v1/fleet": "/api/v1/fleet",
    "/api/v1/runs/{dag_id}/{run_id:path}": f"/api/v1/runs/{F.DAG_A}/scheduled__a1",
    "/compare": "/compare",
    "/api/v1/compare": "/api/v1/compare",
    "/openapi.json": "/openapi.json",
    "/static/{name}": "/static/ett.js",
}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def test_the_paths_cover_every_route() -> None:
    app = create_app()
    assert {r.path for r in app.routes if isinstance(r, APIRoute)} == set(PATHS)
    # no route FastAPI would add without our dependencies (its own docs and schema)
    assert app.openapi_url is None and app.docs_url is None and app.redoc_url is None


def test_every_route_depends_on_airflows_get_user() -> None:
    for route in create_app().routes:
        assert isinstance(route, APIRoute), f"{route!r}: a route that is not an APIRoute"
        assert get_user in set(_calls(route.dependant)), route.path


def test_the_data_routes_carry_airflows_dag_access() -> None:
    routes = {r.path: set(_calls(r.dependant)) for r in create_app().routes
              if isinstance(r, APIRoute)}
    for path in ("/", "/api/v1/fleet", "/compare", "/api/v1/compare"):
        assert {access.fleet_access, access.dag_scope} <= routes[path], path
    for path in ("/runs/{dag_id}/{run_id:path}", "/api/v1/runs/{dag_id}/{run_id:path}"):
        assert access.run_access in routes[path], path


@pytest.mark.parametrize("path", sorted(PATHS.values()))
def test_anonymous_requests_are_401(path: str, store: EttStore) -> None:
    from airflow_ett.plugin.web import deps

    app = create_app()
    app.dependency_overrides[deps.get_store] = lambda: store
    client = TestClient(app)
    for headers in ({}, {"accept": "text/html"}, {"Authorization": "Basic YWRtaW46YWRtaW4="}):
        response = client.get(path, headers=headers)
        assert response.status_code == 401, (path, headers, response.text)
        # nothing of the store shows: only the path asked for, as the sign-in's `next`
        shown = re.sub(r'id="sign-in" href="[^"]*"', "", response.text)
        assert "ett_pages" not in shown


class _Manager:
    def __init__(self, readable: set[str], reads_dags: bool = True) -> None:
        self.readable, self.reads_dags = readable, reads_dags

    def get_authorized_dag_ids(self, *, user: Any, method: str, session: Any) -> set[str]:
        assert method == "GET"
        return set(self.readable)

    def is_authorized_dag(self, *, method: str, user: Any) -> bool:
        return self.reads_dags


class _Session:
    def __init__(self, dag_ids: list[str]) -> None:
        self.dag_ids = dag_ids

    def scalars(self, _query: Any) -> list[str]:
        return list(self.dag_ids)


@pytest.mark.parametrize(("known", "readable", "reads_dags", "every"), [
    (["a", "b"], {"a", "b"}, True, True),     # reads every DAG Airflow knows
    (["a", "b"], {"a"}, True, False),         # not b: computed over a only
    (["a", "b"], {"a", "b"}, False, False),   # the manager says no to DAGs in general
    ([], set(), True, True),                  # no DAG at all: the stored fleet
    ([], set(), False, False),
])
def test_dag_scope(monkeypatch: pytest.MonkeyPatch, known: list[str], readable: set[str],
                   reads_dags: bool, every: bool) -> None:
    monkeypatch.setattr(access, "get_auth_manager", lambda: _Manager(readable, reads_dags))
    scope = access.dag_scope(user=object(), session=_Session(known))  # type: ignore[arg-type]
    assert scope.all_dags is every
    assert scope.dag_ids == frozenset(readable)
