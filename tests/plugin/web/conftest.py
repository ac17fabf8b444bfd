"""The ETT web app under FastAPI's TestClient, on a seeded SQLite store (tests/plugin/web/
fleet.py), with Airflow's security dependencies replaced where a test says who is asking.

`client(...)` overrides, by the callables `access.py` and `deps.py` export:
- `signed_in` (Airflow's `get_user`): a SimpleAuthManager user, unless `user=None`, which
  leaves Airflow's own dependency in place (no credentials: 401);
- `fleet_access` / `run_access` (Airflow's `requires_access_dag`): allowed, except runs of
  the DAGs in `deny_runs` (403, as Airflow answers);
- `dag_scope`: the DAGs the user may read (`DagScope`);
- the store, the clock and "today".
The real-server tests (tests/e2e/test_ett_pages.py) run the same app without overrides.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient

from airflow_ett.plugin.web import access, deps
from airflow_ett.plugin.web.app import create_app
from airflow_ett.plugin.web.data import DagScope
from airflow_ett.store import EttStore, upgrade
from tests.plugin.web import fleet as fleet_data

ADMIN = SimpleAuthManagerUser(username="admin", role="admin")
EVERY_DAG = DagScope(all_dags=True)


@pytest.fixture(scope="session")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, fleet_data.Fleet]:
    url = f"sqlite:///{tmp_path_factory.mktemp('ett-web') / 'ett.db'}"
    upgrade(url)
    with EttStore(url) as store:
        fleet = fleet_data.seed(store, fleet_data.LO1, fleet_data.NOW)
    return url, fleet


@pytest.fixture
def store(seeded: tuple[str, fleet_data.Fleet]) -> Iterator[EttStore]:
    with EttStore(seeded[0]) as s:
        yield s


@pytest.fixture
def fleet(seeded: tuple[str, fleet_data.Fleet]) -> fleet_data.Fleet:
    return seeded[1]


def overridden(app: FastAPI, store: EttStore | None, *, user: Any = ADMIN,
               scope: DagScope = EVERY_DAG, deny_runs: frozenset[str] = frozenset(),
               now: float = fleet_data.NOW, today: dt.date | None = None) -> FastAPI:
    def deny(request: Request) -> None:
        if request.path_params.get("dag_id") in deny_runs:
            raise HTTPException(status_code=403, detail="Forbidden")

    day = today or dt.datetime.fromtimestamp(now, tz=dt.UTC).date()
    overrides: dict[Callable[..., Any], Callable[..., Any]] = {
        access.fleet_access: lambda: None, access.run_access: deny,
        access.dag_scope: lambda: scope, deps.now: lambda: now, deps.today: lambda: day}
    if user is not None:
        overrides[access.signed_in] = lambda: user
    if store is not None:
        overrides[deps.get_store] = lambda: store
    app.dependency_overrides.update(overrides)
    return app


@pytest.fixture
def client(store: EttStore) -> Callable[..., TestClient]:
    def make(**kw: Any) -> TestClient:
        return TestClient(overridden(create_app(), store, **kw))
    return make


@pytest.fixture
def empty_store(tmp_path: Path) -> Iterator[EttStore]:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    with EttStore(url) as s:
        yield s
