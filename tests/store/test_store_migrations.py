"""Migrations: run from code (no alembic.ini), idempotent, in their own version table."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from airflow_ett.rollup import DayPart, Totals, day_parts, day_window, rollup_of_parts
from airflow_ett.store import EttStore, StoreError, current, head, upgrade
from airflow_ett.store.engine import make_engine
from airflow_ett.store.migrate import make_config
from airflow_ett.store.schema import (
    VERSION_TABLE,
    daily_days,
    daily_groups,
    daily_jobs,
    metadata,
)
from tests.store import v1_days
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
                                  "ett_daily_groups", "ett_daily_jobs", "ett_alerts_sent",
                                  "ett_job_flags", VERSION_TABLE}
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
    assert current(fresh_url) == head() == "0005"
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


def _insert_v1_rows(url: str) -> None:
    """The rows the version-1 rollup stored for `v1_days.job_days()` (tests/store/v1_days.py)."""
    fixture = json.loads(v1_days.FIXTURE.read_text(encoding="utf-8"))
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(daily_days), [
                {**row, "provisional": bool(row["provisional"])}
                for row in fixture["ett_daily_days"]])
            conn.execute(sa.insert(daily_groups), fixture["ett_daily_groups"])
    finally:
        engine.dispose()


def _stored_rows(url: str) -> dict[tuple[str, ...], tuple[object, ...]]:
    """Every day and group row: its ETT% column and its payload, parsed (a part's payload
    without its what-if sums, whose form changed: compared as `DayPart`s)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            days = conn.execute(sa.select(daily_days.c.day, daily_days.c.ett_pct,
                                          daily_days.c.payload)).all()
            groups = conn.execute(sa.select(daily_groups.c.day, daily_groups.c.scope,
                                            daily_groups.c.key, daily_groups.c.ett_pct,
                                            daily_groups.c.payload)).all()
    finally:
        engine.dispose()
    out: dict[tuple[str, ...], tuple[object, ...]] = {
        (day,): (ett, json.loads(payload)) for day, ett, payload in days}
    for day, scope, key, ett, payload in groups:
        parsed = json.loads(payload)
        if scope == "part":
            parsed = msgspec.json.decode(payload, type=DayPart).totals
        out[day, scope, key] = (ett, parsed)
    return out


def _roll_up_anew(url: str) -> None:
    with EttStore(url) as store:
        for day, days in v1_days.job_days().items():
            window = day_window(dt.date.fromisoformat(day), "UTC")
            parts = day_parts(days, cut_pct=50.0, start_s=60.0)
            store.daily.replace(rollup_of_parts(window, parts, v1_days.components(),
                                                computed_at=v1_days.COMPUTED_AT,
                                                silent_after_s=v1_days.SILENT_AFTER_S),
                                days, parts)


#: What a group's figures gained after 0003 (decision 0035): days stored before lack them.
_SLOW_STEPS = ("gpu_hours_lost_to_slow_steps", "slow_steps_pct_of_effective")


def _without_slow_steps(key: tuple[str, ...], row: tuple[object, ...]) -> tuple[object, ...]:
    """A row of `_stored_rows` as a rollup before migration 0005 stored it: no slow-step
    figures in its groups, none in its part's sums."""
    ett, payload = row

    def group(g: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in g.items() if k not in _SLOW_STEPS}

    if len(key) == 1:
        assert isinstance(payload, dict)
        payload = {**payload, "fleet": group(payload["fleet"]),
                   "tenants": {k: group(g) for k, g in payload["tenants"].items()},
                   "models": {k: group(g) for k, g in payload["models"].items()}}
    elif key[1] in ("tenant", "model"):
        assert isinstance(payload, dict)
        payload = group(payload)
    elif key[1] == "part":
        assert isinstance(payload, Totals)
        payload = msgspec.structs.replace(payload, slow_steps_gpu_us=0, slow_steps_jobs=0)
    return ett, payload


def test_0003_reweighs_stored_days_by_gpu_time(fresh_url: str, store_url: str) -> None:
    """Days stored by the seconds-weighing rollup, migrated, are the days today's rollup
    stores for the same jobs: every ETT% and share by GPU time, NULL for the day without
    a job; and the downgrade gives the version-1 rows back."""
    upgrade(fresh_url, "0002")
    _insert_v1_rows(fresh_url)
    before = _stored_rows(fresh_url)
    assert before[("2026-11-29",)][0] == pytest.approx(74.0, abs=0.05)  # seconds: the bug
    upgrade(fresh_url)
    _roll_up_anew(store_url)
    migrated, anew = _stored_rows(fresh_url), _stored_rows(store_url)
    assert migrated.keys() == anew.keys()
    for key, row in anew.items():
        assert migrated[key] == _without_slow_steps(key, row), key
    assert migrated[("2026-11-29",)][0] == pytest.approx(100 * 188_028 / 232_308)  # 80.94
    assert migrated[("2026-11-30",)][0] is None
    with EttStore(fresh_url) as store:
        day = store.daily.day("2026-11-29")
        assert day is not None and day.version == 2
        assert day.fleet.shares_pct["effective_training"] == day.fleet.ett_pct
        assert store.daily.parts("2026-11-28")  # the parts still decode
    command.downgrade(make_config(fresh_url), "0002")
    down = _stored_rows(fresh_url)
    for key, (ett, payload) in before.items():
        if key == ("2026-11-30",):  # the empty day's zero what-ifs are not made again
            payload = {**payload, "what_if": []}
        assert down[key] == (ett, payload), key


def test_a_store_not_upgraded_to_0003_says_to_upgrade(fresh_url: str) -> None:
    """A day with no job stores a NULL ETT%, which a store at 0002 refuses: one line that
    says to run `db upgrade`, not the driver's constraint error alone."""
    upgrade(fresh_url, "0002")
    window = day_window(dt.date(2026, 11, 30), "UTC")
    with EttStore(fresh_url) as store, pytest.raises(StoreError, match="db upgrade"):
        store.daily.compute_day(window, v1_days.components(), now=window.hi + 60)


def _slow_steps_columns(url: str) -> dict[str, list[object]]:
    """`gpu_hours_lost_to_slow_steps` of every day and group row (scope/key), by table; an
    empty dict for a table without the column."""
    engine = make_engine(url)
    try:
        out: dict[str, list[object]] = {}
        with engine.connect() as conn:
            for table in ("ett_daily_days", "ett_daily_groups"):
                names = {c["name"] for c in sa.inspect(conn).get_columns(table)}
                if "gpu_hours_lost_to_slow_steps" in names:
                    out[table] = list(conn.execute(sa.text(
                        f"SELECT gpu_hours_lost_to_slow_steps FROM {table}")).scalars())
        return out
    finally:
        engine.dispose()


def test_0005_keeps_the_days_stored_before_slow_steps(fresh_url: str) -> None:
    """A store at 0004 with days and job rows stored before slow steps (decision 0035),
    upgraded: its rows stay, the new columns are NULL on them, and they load with the
    figure None (shown `-`): the day, its groups, its parts merged again and its job rows
    rolled up again. A day rolled up afresh fills the figure; the downgrade drops the
    columns and keeps the rows."""
    upgrade(fresh_url, "0002")
    _insert_v1_rows(fresh_url)
    upgrade(fresh_url, "0004")
    old_payload = {"components_s": {"effective_training": 90.0, "scheduling": 10.0},
                   "tts_s": 10.0, "failures": [], "attempts": 1, "preempted_attempts": 0,
                   "silent": False}  # as `_job_row` wrote it before 0005
    engine = make_engine(fresh_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(daily_jobs), [{
                "day": "2026-11-29", "job": "old", "tenant": "t", "model": "m",
                "dag_id": "d", "run_id": "r", "gpus": 2, "provisional": False,
                "synthetic": False, "e2e_s": 100.0, "effective_s": 90.0,
                "gpu_hours": 200 / 3600, "gpu_hours_lost": 20 / 3600,
                "payload": json.dumps(old_payload)}])
    finally:
        engine.dispose()
    assert _slow_steps_columns(fresh_url) == {}
    upgrade(fresh_url)
    assert current(fresh_url) == "0005"
    columns = _slow_steps_columns(fresh_url)
    assert set(columns) == {"ett_daily_days", "ett_daily_groups"}
    assert {v for values in columns.values() for v in values} == {None}
    with EttStore(fresh_url) as store:
        for stored in store.daily.days():
            for g in (stored.fleet, *stored.tenants.values(), *stored.models.values()):
                assert g.gpu_hours_lost_to_slow_steps is None
                assert g.slow_steps_pct_of_effective is None
        day = store.daily.day("2026-11-28")
        assert day is not None
        window = day_window(dt.date(2026, 11, 28), "UTC")
        merged = rollup_of_parts(window, store.daily.parts("2026-11-28"),
                                 v1_days.components(), computed_at=v1_days.COMPUTED_AT)
        assert merged.fleet.gpu_hours_lost_to_slow_steps is None
        (old,) = store.daily.job_days("2026-11-29")
        assert old.slow_steps_us is None and old.effective_us == 90 * 10**6
        again = day_parts([old], cut_pct=50.0, start_s=60.0)
        assert again[0].totals.figures().gpu_hours_lost_to_slow_steps is None
        # rolled up afresh from events, the day has the figure, in its column too
        store.insert_events(job_events("j", t0=window.lo + 3600))
        fresh = store.daily.compute_day(window, v1_days.components(),
                                        now=v1_days.COMPUTED_AT)
        assert fresh.fleet.jobs == 1 and fresh.fleet.gpu_hours_lost_to_slow_steps == 0.0
        (row,) = store.daily.job_rows("2026-11-28")
    assert row["payload"]["slow_steps_s"] == 0.0  # its five spans are alike
    columns = _slow_steps_columns(fresh_url)
    assert fresh.fleet.gpu_hours_lost_to_slow_steps in columns["ett_daily_days"]
    command.downgrade(make_config(fresh_url), "0004")
    assert _slow_steps_columns(fresh_url) == {}
    with EttStore(fresh_url) as store:
        assert len(store.daily.days()) == 3 and store.daily.job_days("2026-11-29")
