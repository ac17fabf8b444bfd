"""The CLI against both backends: plain `postgresql://` URLs, a database that does not
exist, and listings of odd times already stored (insert by SQL, as an older or laxer
writer could have left them)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from airflow_ett.cli import main
from airflow_ett.store import EttStore
from tests.store.conftest import PgServer
from tests.store.ett_store_helpers import job_events


@pytest.mark.integration
@pytest.mark.postgres
def test_a_plain_postgresql_url_works(pg_store_url: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    plain = pg_store_url.replace("postgresql+psycopg2://", "postgresql://", 1)
    assert plain.startswith("postgresql://")
    assert main(["db", "upgrade", "--store-url", plain]) == 0
    assert "is at revision" in capsys.readouterr().out
    assert main(["runs", "list", "--store-url", plain, "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)


@pytest.mark.integration
@pytest.mark.postgres
def test_a_missing_postgres_database_is_named_not_unavailable(
        pg_server: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_server.create().rsplit("/", 1)[0] + "/ett_no_such_db_here"
    for argv in (["runs", "list"], ["db", "upgrade"], ["runs", "show", "x"]):
        assert main([*argv, "--store-url", url]) == 1
        err = capsys.readouterr().err
        assert "database 'ett_no_such_db_here' does not exist" in err, err
        assert "createdb ett_no_such_db_here" in err and "unavailable" not in err
        assert len(err.strip().splitlines()) == 1


def _insert_job(url: str, job: str, submitted: float, ended: float | None) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO ett_jobs (job, submitted_ts, ended_ts, status, last_event_ts, "
                "version) VALUES (:job, :s, :e, 'success', :s, 1)"),
                {"job": job, "s": submitted, "e": ended})
    finally:
        engine.dispose()


def test_odd_stored_times_never_break_a_listing(
        backend: str, store_url: str, unique_job: Callable[[str], str],
        capsys: pytest.CaptureFixture[str]) -> None:
    good = unique_job("good")
    with EttStore(store_url) as store:
        store.insert_events(job_events(good))
    _insert_job(store_url, unique_job("far"), 1.7e15, None)
    _insert_job(store_url, unique_job("inf"), float("inf"), -float("inf"))
    if backend == "postgres":  # SQLite stores NaN as NULL; PostgreSQL keeps it
        _insert_job(store_url, unique_job("nan"), float("nan"), float("nan"))
    assert main(["runs", "list", "--store-url", store_url]) == 0
    out = capsys.readouterr().out
    assert "1700000000000000.0" in out and "inf" in out
    assert "2023-11-14 22:13:20" in out  # the good job, formatted as always
    if backend == "postgres":
        assert "nan" in out
    assert main(["runs", "list", "--store-url", store_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)  # strict JSON: no bare NaN / Infinity
    assert {r["submitted_ts"] for r in rows} >= {1.7e15, "inf"}
    assert main(["runs", "show", good, "--store-url", store_url]) == 0
    assert f"job {good}" in capsys.readouterr().out
