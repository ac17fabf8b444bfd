"""Migrations: run from code (no alembic.ini), idempotent, in their own version table."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from airflow_ett.store import EttStore, StoreError, current, head, upgrade
from airflow_ett.store.engine import make_engine
from airflow_ett.store.schema import VERSION_TABLE, metadata
from tests.store.ett_store_helpers import job_events, upgrade_worker


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_creates_schema_and_is_idempotent(
    fresh_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no alembic.ini anywhere near
    assert current(fresh_url) is None
    upgrade(fresh_url)
    assert current(fresh_url) == head()
    assert _tables(fresh_url) == {"ett_events", "ett_jobs", "ett_summaries", "ett_daily_days",
                                  "ett_daily_groups", "ett_daily_jobs", VERSION_TABLE}
    upgrade(fresh_url)
    assert current(fresh_url) == head()
    with EttStore(fresh_url) as store:
        assert store.insert_events(job_events("j")) == len(job_events("j"))


def test_upgrading_a_0001_store_keeps_its_events(fresh_url: str) -> None:
    upgrade(fresh_url, "0001")
    with EttStore(fresh_url) as store:
        store.insert_events(job_events("j"))
    assert "ett_daily_days" not in _tables(fresh_url)
    upgrade(fresh_url)
    assert current(fresh_url) == head() == "0002"
    with EttStore(fresh_url) as store:
        assert store.count_events("j") == len(job_events("j"))
        assert store.daily.days() == []


def test_migrated_schema_matches_the_models(store_url: str) -> None:
    engine = make_engine(store_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_sqlite_store_is_in_wal_mode(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    finally:
        engine.dispose()


def test_a_store_without_schema_says_to_upgrade(fresh_url: str) -> None:
    with EttStore(fresh_url) as store, pytest.raises(StoreError, match="db upgrade"):
        store.insert_events(job_events("j"))


@pytest.mark.integration
def test_concurrent_upgrades_all_succeed(fresh_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=upgrade_worker, args=(fresh_url, barrier, results))
             for _ in range(3)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert outcomes == ["ok"] * 3
    assert current(fresh_url) == head()
