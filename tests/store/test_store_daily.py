"""The nightly rollup's rows on both backends: computed from stored events, replaced whole
on a rerun, corrected by late events, read back as the same `DayRollup`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from airflow_ett.ett.events import AttemptEnded, AttemptStarted, Event, JobEnded, JobSubmitted
from airflow_ett.rollup import DayWindow, day_window, load_components
from airflow_ett.store import EttStore, daily, upgrade
from airflow_ett.store.schema import daily_days
from tests.rollup.scenarios import LO, PREVIOUS, WINDOW, job_a, job_b, late_job, slow_job

NOW = LO + 2 * 86400


def windows_after(window: DayWindow, n: int) -> list[DayWindow]:
    import datetime as dt

    return [day_window(window.day + dt.timedelta(days=i), "UTC") for i in range(1, n + 1)]


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


def _with_dag(job: list[Event], dag_id: str | None) -> list[Event]:
    """The job's events, its submission naming `dag_id` (run `r1`)."""
    return [msgspec.structs.replace(e, dag_id=dag_id, run_id="r1")
            if isinstance(e, JobSubmitted) else e for e in job]


def _jobs(rows: list[dict[str, Any]]) -> list[str]:
    return [r["job"] for r in rows]


def test_job_rows_of_some_dags_only(store: EttStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.insert_events([*_with_dag(job_a(), "dag_a"), *_with_dag(job_b(), "dag_b"),
                         *late_job()])  # the late job has no DAG
    store.daily.compute_day(WINDOW, load_components(), now=NOW)
    day = "2026-11-28"
    assert _jobs(store.daily.job_rows(day)) == ["b", "late", "a"]  # b, late: a tie (1000 s)
    assert _jobs(store.daily.job_rows(day, dag_ids={"dag_a"})) == ["a"]
    assert store.daily.dag_ids_of_day(day) == {"dag_a", "dag_b", None}
    assert store.daily.dag_ids_of_day("2026-11-27") == set()  # not rolled up
    assert _jobs(store.daily.job_rows(day, dag_ids=["dag_a", "dag_b", "dag_a"])) == ["b", "a"]
    assert _jobs(store.daily.job_rows(day, dag_ids=["dag_b", "dag_a"], limit=1)) == ["b"]
    assert store.daily.job_rows(day, dag_ids=set()) == []  # no DAG readable: no row, no query
    assert store.daily.job_rows(day, dag_ids={"unknown"}) == []
    assert store.daily.job_rows("2026-11-27", dag_ids={"dag_b"}) == []  # b ran on D only
    assert _jobs(store.daily.job_rows("2026-11-27", dag_ids={"dag_a"})) == []  # not rolled up
    whole = store.daily.job_rows(day, dag_ids={"dag_a", "dag_b"})
    # A long list is read a chunk of ids at a time and merged in the one query's order.
    monkeypatch.setattr(daily, "_DAG_CHUNK", 1)
    assert store.daily.job_rows(day, dag_ids={"dag_a", "dag_b", "x"}) == whole
    assert _jobs(store.daily.job_rows(day, dag_ids={"dag_a", "dag_b"}, limit=1)) == ["b"]


def test_job_rows_of_some_dags_use_the_day_dag_index(tmp_path: Path) -> None:
    """The statement `job_rows` sends reads the DAGs' rows by the (day, dag_id) index, not
    the whole day (as SQLite does when the query also orders by GPU-hours lost). SQLite
    only: PostgreSQL plans a tiny table as a sequential scan whatever the indexes."""
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    with EttStore(url) as store:
        _check_day_dag_index(store)


def _check_day_dag_index(store: EttStore) -> None:
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        if "ett_daily_jobs" in statement:
            sent.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", capture)
    try:
        store.daily.job_rows("2026-11-28", dag_ids={"dag_a", "dag_b"})
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", capture)
    assert len(sent) == 1
    statement, parameters = sent[0]
    with store.engine.connect() as conn:
        plan = " ".join(str(row[-1]) for row in conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {statement}", parameters))
    assert "USING INDEX ix_ett_daily_jobs_day_dag_id (day=? AND dag_id=?)" in plan, plan


def test_the_last_stored_day(store: EttStore) -> None:
    assert store.daily.last_day() is None
    store.insert_events([*job_a(), *job_b()])
    store.daily.compute_day(WINDOW, load_components(), now=NOW)
    store.daily.compute_day(PREVIOUS, load_components(), now=NOW)  # computed last, older
    assert store.daily.last_day() == "2026-11-28"


def test_job_days_give_back_what_the_day_was_rolled_up_from(store: EttStore) -> None:
    from airflow_ett.ett.attribution import attribute_job
    from airflow_ett.rollup import job_day
    from airflow_ett.store.daily import job_day_of_row

    store.insert_events([*_with_dag(job_a(), "dag_a"), *_with_dag(job_b(), "dag_b"),
                         *late_job()])
    store.daily.compute_day(WINDOW, load_components(), now=NOW)
    expected = {}
    for job in ("a", "b", "late"):
        a = attribute_job(store.job_events(job), now=NOW)
        expected[job] = job_day(a, WINDOW, gpus=a.world_size, synthetic=a.synthetic)
    got = {d.job: d for d in store.daily.job_days("2026-11-28")}
    assert got == expected  # microseconds exact, failures, TTS, attempts, DAG and run
    assert got["b"].failures and got["b"].dag_id == "dag_b" and got["b"].run_id == "r1"
    assert {r["job"]: job_day_of_row(r) for r in store.daily.job_rows("2026-11-28")} == got
    assert [d.job for d in store.daily.job_days("2026-11-28", dag_ids={"dag_b"})] == ["b"]
    assert store.daily.job_days("2026-11-28", dag_ids=()) == []


def test_the_parts_of_a_day_are_stored_replaced_and_read_back(store: EttStore) -> None:
    from airflow_ett.rollup import day_parts, rollup_of_parts

    store.insert_events([*_with_dag(job_a(), "dag_a"), *_with_dag(job_b(), "dag_b"),
                         *late_job()])
    rollup = store.daily.compute_day(WINDOW, load_components(), now=NOW, cut_pct=20,
                                     start_s=30)
    parts = store.daily.parts("2026-11-28")
    # one part per (DAG, tenant, model), in key order; the CLI's late job has no DAG
    assert [(p.dag_id, p.tenant, p.model, p.totals.jobs) for p in parts] == [
        (None, "t3", "", 1), ("dag_a", "t1", "m1", 1), ("dag_b", "t2", "m1", 1)]
    assert parts == day_parts(store.daily.job_days("2026-11-28"), cut_pct=20, start_s=30)
    assert rollup_of_parts(WINDOW, parts, load_components(), computed_at=NOW, cut_pct=20,
                           start_s=30) == rollup
    assert {r["key"] for r in store.daily.group_rows("2026-11-28", daily.PART_SCOPE)} == {
        '[null,"t3",""]', '["dag_a","t1","m1"]', '["dag_b","t2","m1"]'}
    store.daily.compute_day(WINDOW, load_components(), now=NOW + 1, cut_pct=20, start_s=30)
    assert store.daily.parts("2026-11-28") == parts  # replaced, not doubled
    assert store.daily.parts("2026-11-20") == []


def test_a_silent_job_stops_counting_a_bound_after_its_last_event(store: EttStore) -> None:
    """A job that never ends and falls silent (its worker died unseen) is counted up to
    `silent_after_s` after its last event, not in every later day; with no bound, up to
    now. An event that arrives later moves the cut."""
    from tests.rollup.scenarios import Maker

    m = Maker("lost")
    store.insert_events([m(JobSubmitted, ts=LO + 1000, tenant="t1", model="m1"),
                         m(AttemptStarted, ts=LO + 1100, attempt="1")])
    later = windows_after(WINDOW, 2)
    now = later[-1].hi + 3600  # two days and an hour after D
    unbounded = [store.daily.compute_day(w, load_components(), now=now)
                 for w in (WINDOW, *later)]
    assert [d.fleet.e2e_s for d in unbounded] == [86400 - 1000, 86400, 86400]
    assert [d.silent_jobs for d in unbounded] == [0, 0, 0]
    bound = 3 * 3600.0
    cut = [store.daily.compute_day(w, load_components(), now=now, silent_after_s=bound)
           for w in (WINDOW, *later)]
    # up to 3 h after the last event (LO + 1100), then nowhere
    assert [d.fleet.e2e_s for d in cut] == [100 + bound, 0.0, 0.0]
    assert [d.silent_jobs for d in cut] == [1, 0, 0] and cut[0].silent_after_s == bound
    assert cut[0].provisional and cut[0].fleet.provisional_jobs == 1
    assert store.daily.jobs_touching(later[0].lo, later[0].hi, silent_after_s=bound) == []
    assert store.daily.jobs_touching(later[0].lo, later[0].hi) == ["lost"]
    row = store.daily.job_rows(WINDOW.iso)[0]
    assert row["payload"]["silent"] is True and store.daily.job_days(WINDOW.iso)[0].silent
    note = cut[0].silent_note()
    assert note is not None and note.startswith("1 job(s) not ended and silent for over 3 h")
    assert unbounded[0].silent_note() is None
    # It speaks again a day later: counted through the gap, up to 3 h after that event.
    store.insert_events([m(AttemptEnded, ts=later[0].lo + 600, attempt="1", status="failed",
                           cause="infra")])
    again = [store.daily.compute_day(w, load_components(), now=now, silent_after_s=bound)
             for w in (WINDOW, *later)]
    assert [d.fleet.e2e_s for d in again] == [86400 - 1000, 600 + bound, 0.0]
    assert [d.silent_jobs for d in again] == [0, 1, 0]
    # A job that ended is never cut, however old its last event.
    store.insert_events([m(JobEnded, ts=later[0].lo + 700, status="failed")])
    ended = store.daily.compute_day(later[0], load_components(), now=now,
                                    silent_after_s=bound)
    assert ended.fleet.e2e_s == 700 and ended.silent_jobs == 0 and not ended.provisional


def test_a_job_running_up_to_a_fractional_now_is_not_silent(store: EttStore) -> None:
    """`now` from time.time() has digits below the microsecond the attribution keeps: a
    job running up to it is not silent, with or without a bound it is within."""
    from tests.rollup.scenarios import Maker

    m = Maker("live")
    store.insert_events([m(JobSubmitted, ts=LO + 1000, tenant="t1", model="m1"),
                         m(AttemptStarted, ts=LO + 1100, attempt="1")])
    from airflow_ett.ett.timeline import to_s, to_us

    # a `now` that the microsecond rounding moves down (about a third of them)
    now = next(t for t in (LO + 5000 + k / 7 for k in range(1, 100)) if to_s(to_us(t)) < t)
    for bound in (0.0, 86400.0):
        day = store.daily.compute_day(WINDOW, load_components(), now=now, silent_after_s=bound)
        assert day.silent_jobs == 0 and day.provisional, bound


def test_a_row_with_components_left_out_reads_them_as_zero() -> None:
    from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
    from airflow_ett.store.daily import job_day_of_row

    row = {"job": "j", "tenant": "t", "model": "m", "dag_id": None, "run_id": None,
           "gpus": 2, "provisional": 0, "synthetic": 1, "e2e_s": 1.5,
           "payload": {"components_s": {EFFECTIVE: 1.000001}, "tts_s": 0.25,
                       "failures": [{"cause": "infra"}, {"cause": "preemption", "ttr_s": 2.0}]}}
    d = job_day_of_row(row)
    assert list(d.components_us) == list(COMPONENTS)
    assert d.components_us[EFFECTIVE] == 1_000_001 and sum(d.components_us.values()) == 1_000_001
    assert (d.e2e_us, d.tts_us, d.gpus, d.provisional, d.synthetic) == (1_500_000, 250_000, 2,
                                                                         False, True)
    assert [(f.cause, f.ttr_us) for f in d.failures] == [("infra", None),
                                                          ("preemption", 2_000_000)]
    assert (d.attempts, d.preempted_attempts) == (0, 0)


def test_a_day_with_no_job_stores_no_ett(store: EttStore) -> None:
    """NULL in the ETT% column (migration 0003 made it nullable), None read back: never
    0.0, never an SLO breach (decision 0010)."""
    rollup = store.daily.compute_day(WINDOW, load_components(), now=NOW)
    assert rollup.fleet.jobs == 0 and rollup.fleet.ett_pct is None
    with store.engine.connect() as conn:
        assert conn.scalar(sa.select(daily_days.c.ett_pct)
                           .where(daily_days.c.day == "2026-11-28")) is None
    stored = store.daily.day("2026-11-28")
    assert stored == rollup and {row.status for row in stored.slo} == {"none"}


def test_a_windows_parts_are_read_by_day_with_their_gpu_counts(store: EttStore) -> None:
    from airflow_ett.rollup.compare import sums_of
    from tests.rollup.compare_days import WEEK_1, parts_of, store_days

    store_days(store, load_components(), days=3)
    by_day = store.daily.window_parts("2026-10-31", "2026-11-02")  # a day before the first
    assert list(by_day) == ["2026-11-01", "2026-11-02"]  # stored days only, oldest first
    assert by_day["2026-11-01"] == [sums_of(p) for p in parts_of(WEEK_1)]  # JSON skipped
    assert [p.gpu_counts for p in by_day["2026-11-02"]] == [{8: 1}, {4: 1}, {8: 1}]
    assert store.daily.window_parts("2026-11-04", "2026-11-09") == {}


def test_slow_steps_are_stored_by_day_and_read_back_exact(store: EttStore) -> None:
    """Job s lost 1000 s to slow steps on 4 GPUs, 1/3 of it allotted to the day before D
    and 2/3 to D by its effective time (decision 0035): the rows give back the job-days'
    microseconds, the columns the figures, and the two days hold the whole loss."""
    from airflow_ett.ett.attribution import attribute_job
    from airflow_ett.rollup import job_day

    store.insert_events([*job_a(), *slow_job()])
    days = [store.daily.compute_day(w, load_components(), now=NOW) for w in (PREVIOUS, WINDOW)]
    a = attribute_job(store.job_events("s"), now=NOW)
    for window, rollup in zip((PREVIOUS, WINDOW), days, strict=True):
        got = {d.job: d for d in store.daily.job_days(rollup.day)}
        assert got["s"] == job_day(a, window, gpus=4)
        assert got["a"].slow_steps_us == 0  # its one span is its own ideal
        (column,) = [r["gpu_hours_lost_to_slow_steps"] for r in store.daily.group_rows(
            rollup.day, "tenant") if r["key"] == "t1"]
        assert column == rollup.tenants["t1"].gpu_hours_lost_to_slow_steps
    by_day = [{d.job: d.slow_steps_us for d in store.daily.job_days(r.day)} for r in days]
    assert [s["s"] for s in by_day] == [333_333_333, 666_666_667]
    total = sum(d.slow_steps_us or 0 for r in days for d in store.daily.job_days(r.day))
    assert total == 1000 * 10**6
    assert sum(r.fleet.gpu_hours_lost_to_slow_steps or 0.0 for r in days) == pytest.approx(
        4 * 1000 / 3600)


def test_a_stored_event_that_no_longer_decodes_is_left_out_of_the_day_by_its_id(
        store: EttStore, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_ett.store.schema import events as events_table

    store.insert_events(job_b())
    odd = {"type": "job_ended", "v": 1, "id": "odd", "job": "b", "ts": 1e300,
           "status": "success"}
    with store.engine.begin() as conn:  # as an earlier version let it in
        seq = conn.scalar(sa.select(sa.func.max(events_table.c.seq))) or 0
        conn.execute(events_table.insert().values(
            id="odd", seq=seq + 1, job="b", type="job_ended", ts=LO + 5000, attempt=None,
            payload=json.dumps(odd), ingested_at=LO))
    rollup = store.daily.compute_day(WINDOW, load_components(), now=NOW)
    assert rollup.fleet.jobs == 1
    assert "stored event 'odd' left out of the rollup" in caplog.text
