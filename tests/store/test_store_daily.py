"""The nightly rollup's rows on both backends: computed from stored events, replaced whole
on a rerun, corrected by late events, read back as the same `DayRollup`."""

from __future__ import annotations

import pytest

from airflow_ett.ett.events import JobSubmitted
from airflow_ett.rollup import load_components
from airflow_ett.store import EttStore
from tests.rollup.scenarios import LO, PREVIOUS, WINDOW, job_a, job_b, late_job

NOW = LO + 2 * 86400


def test_a_day_is_computed_from_the_stored_events(store: EttStore) -> None:
    store.insert_events([*job_a(), *job_b()])
    rollup = store.daily.compute_day(WINDOW, load_components(), now=NOW)
    assert rollup.fleet.e2e_s == 5500.0 and rollup.fleet.effective_s == 4500.0
    stored = store.daily.day("2026-11-28")
    assert stored == rollup  # the JSON form reads back as the same struct
    rows = store.daily.job_rows("2026-11-28")
    assert [r["job"] for r in rows] == ["b", "a"]  # most GPU-hours lost first
    a = rows[1]
    assert (a["gpus"], a["e2e_s"], a["effective_s"]) == (2, 3000.0, 3000.0)
    assert a["gpu_hours"] == pytest.approx(6000 / 3600) and a["payload"]["tts_s"] is None
    tenants = {r["key"]: r for r in store.daily.group_rows("2026-11-28", "tenant")}
    assert tenants["t1"]["ett_pct"] == 100.0 and tenants["t2"]["jobs"] == 1
    teams = {r["key"] for r in store.daily.group_rows("2026-11-28", "team")}
    assert "checkpoint-team" in teams
    before = store.daily.compute_day(PREVIOUS, load_components(), now=NOW)
    assert before.fleet.jobs == 1 and before.fleet.e2e_s == 3600.0  # A's first hour only
    assert [d.day for d in store.daily.days()] == ["2026-11-27", "2026-11-28"]
    assert [d.day for d in store.daily.days(first="2026-11-28")] == ["2026-11-28"]


def test_a_rerun_replaces_the_day_and_late_events_correct_it(store: EttStore) -> None:
    store.insert_events(job_b())
    components = load_components()
    first = store.daily.compute_day(WINDOW, components, now=NOW)
    again = store.daily.compute_day(WINDOW, components, now=NOW + 60)
    assert again.computed_at == NOW + 60
    assert len(store.daily.job_rows("2026-11-28")) == 1  # replaced, not doubled
    assert again.fleet == first.fleet
    # A late job of D arrives (submitted, ran 1000 s effective-less, ended): D is corrected.
    store.insert_events(late_job())
    corrected = store.daily.compute_day(WINDOW, components, now=NOW + 120)
    assert corrected.fleet.jobs == 2 and corrected.fleet.e2e_s == 3500.0
    assert corrected.fleet.nof["application"] == 1
    assert {r["job"] for r in store.daily.job_rows("2026-11-28")} == {"b", "late"}


def test_a_day_reads_only_the_jobs_that_touch_it(store: EttStore) -> None:
    store.insert_events([*job_a(), *job_b()])
    assert store.daily.jobs_touching(WINDOW.lo, WINDOW.hi) == ["a", "b"]
    assert store.daily.jobs_touching(PREVIOUS.lo, PREVIOUS.hi) == ["a"]
    assert store.daily.jobs_touching(WINDOW.hi, WINDOW.hi + 86400) == []
    # a job with no end yet touches every day from its submission on
    store.insert_events([JobSubmitted(id="r1", job="running", ts=LO + 100)])
    assert store.daily.jobs_touching(WINDOW.hi + 86400 * 5, WINDOW.hi + 86400 * 6) == [
        "running"]
