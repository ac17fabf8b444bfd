"""What each run of the nightly rollup DAG does (`nightly_rollup`, `day_of_run`), without a
scheduler: a month of days rolled up one run at a time as a backfill runs them, on a real
SQLite store. The DAG itself (catch-up, a rerun, a few backfilled days through `airflow
backfill create`) runs on a real Airflow in tests/e2e/test_fleet_rollup_dag.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_ett.operators.rollup import day_of_run, nightly_rollup
from airflow_ett.rollup import day_window
from airflow_ett.rollup.calendar import CalendarError
from airflow_ett.store import EttStore, upgrade
from tests.rollup.scenarios import D, job_a, job_b, late_job

NOW = day_window(D + dt.timedelta(days=20), "UTC").lo  # long after every day rolled up


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    monkeypatch.setenv("AIRFLOW__ETT__STORE_URL", url)
    monkeypatch.setenv("AIRFLOW__ETT__REPORT_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("AIRFLOW__ETT__ROLLUP_TIMEZONE", "UTC")
    monkeypatch.setenv("AIRFLOW__ETT__ROLLUP_RECOMPUTE_DAYS", "1")
    return url


def test_a_backfilled_month_stores_every_day_once_with_its_reports(
        store_url: str, tmp_path: Path) -> None:
    with EttStore(store_url) as store:
        store.insert_events([*job_a(), *job_b()])  # A across D's midnight, B inside D
    first = D - dt.timedelta(days=15)
    days = [first + dt.timedelta(days=i) for i in range(30)]
    for day in days:  # one backfill run per day, oldest first
        assert nightly_rollup(day, now=NOW) == [str(tmp_path / "reports" / day.isoformat())]
    nightly_rollup(D, now=NOW + 60)  # a day run twice is replaced, not doubled
    with EttStore(store_url) as store:
        stored = store.daily.days(days[0].isoformat(), days[-1].isoformat())
        assert [d.day for d in stored] == [d.isoformat() for d in days]
        jobs = {d.day: d.fleet.jobs for d in stored}
        assert jobs.pop((D - dt.timedelta(days=1)).isoformat()) == 1  # A's hour before
        assert jobs.pop(D.isoformat()) == 2
        assert set(jobs.values()) == {0}
        assert len(store.daily.job_rows(D.isoformat())) == 2
        quiet = store.daily.day(days[0].isoformat())
        assert quiet is not None and quiet.fleet.ett_pct is None  # no job: no ETT%, not 0
    for day in days:
        folder = tmp_path / "reports" / day.isoformat()
        assert {p.name for p in folder.iterdir()} >= {"report.txt", "report.json",
                                                     "report.csv", "index.html"}


def test_recompute_days_rewrites_the_days_before_and_late_events_correct_them(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with EttStore(store_url) as store:
        store.insert_events(job_b())
    nightly_rollup(D, now=NOW)
    with EttStore(store_url) as store:
        store.insert_events(late_job())
    monkeypatch.setenv("AIRFLOW__ETT__ROLLUP_RECOMPUTE_DAYS", "3")
    after = D + dt.timedelta(days=2)
    written = nightly_rollup(after, now=NOW + 60)
    assert written == [str(tmp_path / "reports" / (D + dt.timedelta(days=i)).isoformat())
                       for i in range(3)]
    with EttStore(store_url) as store:
        corrected = store.daily.day(D.isoformat())
        assert corrected is not None
        assert corrected.fleet.jobs == 2 and corrected.fleet.nof["application"] == 1


def _context(conf: dict[str, str] | None = None,
             start: dt.datetime | None = None) -> dict[str, object]:
    return {"dag_run": SimpleNamespace(conf=conf or {}), "data_interval_start": start}


def test_the_day_of_a_run() -> None:
    assert day_of_run(_context({"date": "2026-11-28"}), "UTC") == D  # a manual rerun
    start = dt.datetime(2026, 11, 28, 23, 30, tzinfo=dt.UTC)
    assert day_of_run(_context(start=start), "UTC") == D
    assert day_of_run(_context(start=start), "Europe/Berlin") == D + dt.timedelta(days=1)
    today = dt.datetime.now(dt.UTC).date()
    assert day_of_run(_context(), "UTC") in (today - dt.timedelta(days=1), today)


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01", "1900-01-01"])
def test_a_bad_conf_date_is_one_line_naming_it(value: str) -> None:
    with pytest.raises(CalendarError) as err:
        day_of_run(_context({"date": value}), "UTC")
    assert str(err.value).startswith("conf.date: ") and "\n" not in str(err.value)
