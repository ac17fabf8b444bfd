"""Store fixtures: every store test runs against a real SQLite file and a real PostgreSQL.

PostgreSQL gets one throwaway database per test session (`ett_test_<random>`), dropped at
the end; tests share it and start from truncated tables. Set ETT_TEST_PG_DSN to point at
another server (a libpq DSN for the admin connection to its `postgres` database).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest
from psycopg2.extensions import connection as PgConnection

from airflow_ett.store import EttStore, upgrade

PG_DSN = os.environ.get("ETT_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres")

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.integration]),
]


class PgServer:
    """An admin connection that makes and drops throwaway databases."""

    def __init__(self, admin: PgConnection) -> None:
        self.admin = admin
        params = admin.get_dsn_parameters()
        self._base = (f"postgresql+psycopg2://{params['user']}@{params['host']}:"
                      f"{params['port']}/")
        self.created: list[str] = []

    def create(self) -> str:
        name = f"ett_test_{secrets.token_hex(6)}"
        with self.admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self._base + name

    def drop_all(self) -> None:
        with self.admin.cursor() as cur:
            for name in self.created:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    try:
        admin = psycopg2.connect(f"{PG_DSN} dbname=postgres connect_timeout=5")
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable ({PG_DSN}): {str(exc).strip()}")
    admin.autocommit = True
    server = PgServer(admin)
    try:
        yield server
    finally:
        server.drop_all()
        admin.close()


@pytest.fixture(scope="session")
def pg_store_url(pg_server: PgServer) -> str:
    """The session's shared, migrated PostgreSQL store."""
    url = pg_server.create()
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file that tests copy, instead of migrating one each."""
    path = tmp_path_factory.mktemp("template") / "ett.db"
    upgrade(f"sqlite:///{path}")
    return path


def _truncate(url: str) -> None:
    store = EttStore(url)
    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE ett_events, ett_jobs, ett_summaries, ett_daily_days, "
                                  "ett_daily_groups, ett_daily_jobs, ett_alerts_sent, "
                                  "ett_job_flags")
    finally:
        store.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty store of the test's backend."""
    if backend == "postgres":
        url: str = request.getfixturevalue("pg_store_url")
        _truncate(url)
        return url
    template: Path = request.getfixturevalue("sqlite_template")
    path = tmp_path / "ett.db"
    path.write_bytes(template.read_bytes())
    return f"sqlite:///{path}"


@pytest.fixture
def fresh_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of the test's backend, never migrated."""
    if backend == "postgres":
        server: PgServer = request.getfixturevalue("pg_server")
        return server.create()
    return f"sqlite:///{tmp_path / 'sub' / 'dir' / 'ett.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[EttStore]:
    with EttStore(store_url) as opened:
        yield opened


@pytest.fixture
def unique_job() -> Callable[[str], str]:
    """Job ids unique across tests and hypothesis examples sharing one database."""
    def make(prefix: str = "job") -> str:
        return f"{prefix}-{secrets.token_hex(6)}"
    return make
