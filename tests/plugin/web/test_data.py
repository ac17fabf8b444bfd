"""The pages' figures (`airflow_ett.plugin.web.data`) against the store they are read from.

The fleet over the DAGs a user may read is the merge of those DAGs' stored parts (or, for a
day stored before parts were, recomputed from their job rows): with every DAG readable it
must give back the stored days exactly, and with one DAG it must equal a
rollup made straight from that DAG's events (not from the rows), so the two paths cannot
share a mistake. A run's figures must equal the store's own summary of the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gc
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from airflow_ett.ett.attribution import attribute_job, clip_to_window
from airflow_ett.jobs import job_id_for
from airflow_ett.plugin.web import data
from airflow_ett.plugin.web.data import DagScope, DaysError, days_asked
from airflow_ett.rollup import (
    DayPart,
    DayRollup,
    DayWindow,
    JobDay,
    job_day,
    load_components,
    rollup_day,
    rollup_of_parts,
)
from airflow_ett.store import EttStore
from airflow_ett.store.daily import DailyRollups
from tests.plugin.web import fleet as F

TODAY = dt.date(2026, 11, 28)
ONLY_A = DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A}))


@pytest.mark.parametrize(("first", "last", "expected"), [
    (None, None, (dt.date(2026, 11, 15), TODAY)),
    (dt.date(2026, 11, 1), None, (dt.date(2026, 11, 1), dt.date(2026, 11, 14))),
    (None, dt.date(2026, 11, 14), (dt.date(2026, 11, 1), dt.date(2026, 11, 14))),
    (TODAY, TODAY, (TODAY, TODAY)),
    (dt.date(2026, 9, 1), dt.date(2026, 11, 30), (dt.date(2026, 9, 1), dt.date(2026, 11, 30))),
])
def test_days_asked(first: dt.date | None, last: dt.date | None,
                    expected: tuple[dt.date, dt.date]) -> None:
    assert days_asked(first, last, TODAY) == expected


def test_days_asked_refuses_a_reversed_or_long_range() -> None:
    with pytest.raises(DaysError, match="to: 2026-11-27 is before from: 2026-11-28"):
        days_asked(TODAY, TODAY - dt.timedelta(days=1), TODAY)
    longest = TODAY - dt.timedelta(days=data.MAX_DAYS - 1)
    assert days_asked(longest, TODAY, TODAY) == (longest, TODAY)
    with pytest.raises(DaysError, match=f"from/to: {data.MAX_DAYS + 1} days; at most "
                                        f"{data.MAX_DAYS}"):
        days_asked(longest - dt.timedelta(days=1), TODAY, TODAY)


def test_scope_allows() -> None:
    assert DagScope(all_dags=True).allows(None) and DagScope(all_dags=True).allows("x")
    assert ONLY_A.allows(F.DAG_A)
    assert not ONLY_A.allows(F.DAG_SECRET) and not ONLY_A.allows(None)
    assert ONLY_A.model().readable_dags == 1
    assert DagScope(all_dags=True).model().readable_dags is None


def test_every_dag_readable_gives_back_the_stored_days(store: EttStore, fleet: F.Fleet) -> None:
    everything = DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A, F.DAG_SECRET}))
    for stored in fleet.days:
        if stored.day == "2026-11-26":  # the CLI job of day 1 has no DAG: not readable
            continue
        assert msgspec.structs.asdict(data.readable_day(store, stored, everything)) == \
            msgspec.structs.asdict(stored)
        # readable_day skips the recomputation when every job of the day is readable: the
        # recomputation itself must give the stored day back, from the store's job-days.
        assert data._recompute(store, stored, everything, None) == stored
    # Every row, the CLI job's too, rebuilds each stored day exactly.
    for stored in fleet.days:
        window = DayWindow(day=dt.date.fromisoformat(stored.day), tz="UTC", lo=stored.lo,
                           hi=stored.hi)
        parts = [data.job_day_of_row(r) for r in store.daily.job_rows(stored.day)]
        assert rollup_day(window, parts, load_components(),
                          computed_at=stored.computed_at) == stored
        # and the stored parts, merged, give the day back too
        assert rollup_of_parts(window, store.daily.parts(stored.day), load_components(),
                               computed_at=stored.computed_at) == stored


def test_a_restricted_day_equals_a_rollup_of_that_dags_events(store: EttStore,
                                                             fleet: F.Fleet) -> None:
    day2 = next(d for d in fleet.days if d.day == "2026-11-27")
    window = DayWindow(day=dt.date(2026, 11, 27), tz="UTC", lo=day2.lo, hi=day2.hi)
    a1 = attribute_job(store.job_events(job_id_for(F.DAG_A, "scheduled__a1")), now=fleet.now)
    part = job_day(a1, window, gpus=a1.world_size)
    assert part is not None
    expected = rollup_day(window, [part], load_components(), computed_at=day2.computed_at)
    got = data.readable_day(store, day2, ONLY_A)
    assert got == expected
    assert got.fleet.jobs == 1 and set(got.tenants) == {"ads-ranking"}
    assert [r.dag_id for r in got.top_runs] == [F.DAG_A]
    assert day2.fleet.jobs == 2 and "search" in day2.tenants  # the stored day has both


def test_a_restricted_fleet_hides_the_other_dags_jobs(store: EttStore, fleet: F.Fleet) -> None:
    view = data.fleet(store, fleet.first, fleet.last, ONLY_A, figures=True)
    text = view.model_dump_json()
    for hidden in (F.DAG_SECRET, "search", "two_tower", "cli-c1", "research"):
        assert hidden not in text
    assert [p.jobs for p in view.days] == [1, 1, 1]
    assert view.scope.all_dags is False and view.scope.readable_dags == 1
    assert any("1 DAG(s) you may read" in n for n in view.notes)


def test_the_fleet_view_of_the_stored_days(store: EttStore, fleet: F.Fleet) -> None:
    from airflow_ett.report.html import fleet_figures

    view = data.fleet(store, fleet.first, fleet.last, DagScope(all_dags=True), figures=True)
    # the day of `now` has only the running job A2: the headline is the day before it
    running, last, before = fleet.days[-1], fleet.days[-2], fleet.days[-3]
    assert running.fleet.provisional_jobs == running.fleet.jobs == 1
    assert [p.day for p in view.days] == [d.day for d in fleet.days]
    assert [p.ett_pct for p in view.days] == [d.fleet.ett_pct for d in fleet.days]
    assert view.days[-1].provisional  # still in the trend, marked
    assert view.latest is not None and view.latest.day == last.day
    assert view.latest.fleet.ett_pct == last.fleet.ett_pct
    assert view.latest.ett_pct_change == pytest.approx(last.fleet.ett_pct - before.fleet.ett_pct)
    assert view.latest.previous_day == before.day
    assert [w.gain_pts for w in view.latest.what_if] == sorted(
        (w.gain_pts for w in last.what_if), reverse=True)
    assert view.figures == fleet_figures(fleet.days)
    assert [r.href for r in view.latest.top_runs] == [
        f"runs/{F.DAG_SECRET}/manual__b1", f"runs/{F.DAG_A}/scheduled__a1"]
    assert f"{running.day} is provisional: all its 1 job(s) were still running" in " ".join(
        view.notes)
    # asked for alone, the running day is the headline: there is no other
    alone = data.fleet(store, fleet.last, fleet.last, DagScope(all_dags=True))
    assert alone.latest is not None and alone.latest.day == running.day
    assert [r.href for r in alone.latest.top_runs] == [f"runs/{F.DAG_A}/{fleet.running_run_id}"]
    assert data.fleet(store, fleet.first, fleet.last, DagScope(all_dags=True)).figures is None


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """Every day's parts and job-days read, as (what, day, collector enabled)."""
    reads: list[tuple[str, str, bool]] = []
    parts, job_days = DailyRollups.parts, DailyRollups.job_days

    def spy_parts(self: DailyRollups, day: str) -> list[DayPart]:
        reads.append(("parts", day, gc.isenabled()))
        return parts(self, day)

    def spy_job_days(self: DailyRollups, day: str, **kw: Any) -> list[JobDay]:
        reads.append(("job_days", day, gc.isenabled()))
        got = job_days(self, day, **kw)
        assert {d.dag_id for d in got} <= set(kw["dag_ids"])  # the readable DAGs' only
        return got

    monkeypatch.setattr(DailyRollups, "parts", spy_parts)
    monkeypatch.setattr(DailyRollups, "job_days", spy_job_days)
    return reads


@contextlib.contextmanager
def _parts_forgotten(store: EttStore, day: str) -> Iterator[None]:
    """The day as a version before parts stored it (its job rows, no part rows) inside the
    block; its part rows back after it (the store is the session's)."""
    import sqlalchemy as sa

    from airflow_ett.store.daily import PART_SCOPE, _part_row
    from airflow_ett.store.schema import daily_groups

    c = daily_groups.c
    kept = [_part_row(day, p) for p in store.daily.parts(day)]
    store._write(lambda conn: conn.execute(
        sa.delete(daily_groups).where(c.day == day, c.scope == PART_SCOPE)))
    try:
        yield
    finally:
        store._write(lambda conn: conn.execute(sa.insert(daily_groups), kept))


def test_a_restricted_day_adds_up_the_stored_parts_and_reads_no_job_row(
        store: EttStore, fleet: F.Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = fleet.days[1]
    assert {p.dag_id for p in store.daily.parts(stored.day)} == {F.DAG_A, F.DAG_SECRET}
    reads = _spy_reads(monkeypatch)
    # A DAG set no earlier test used: not in the pages' cache of recent days.
    only_a = DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A, "no_such_dag"}))
    got = data.readable_day(store, stored, only_a)
    assert reads == [("parts", stored.day, True)]
    assert got == data.readable_day(store, stored, ONLY_A) and got.fleet.jobs == 1


def test_a_day_stored_without_parts_is_made_from_the_readable_dags_rows(
        store: EttStore, fleet: F.Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = fleet.days[1]
    with_parts = data._recompute(store, stored, ONLY_A, None)
    with _parts_forgotten(store, stored.day):
        _recomputed_from_rows(store, stored, with_parts, monkeypatch)
    assert store.daily.parts(stored.day) != []


def _recomputed_from_rows(store: EttStore, stored: DayRollup, with_parts: DayRollup,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert store.daily.parts(stored.day) == []
    reads = _spy_reads(monkeypatch)
    assert gc.isenabled()
    assert data._recompute(store, stored, ONLY_A, None) == with_parts
    # read with the collector paused (the module's `_collector_paused` says why), and
    # enabled again after
    assert reads == [("parts", stored.day, True), ("job_days", stored.day, False)]
    assert gc.isenabled()
    gc.disable()
    try:  # a caller who disabled the collector keeps it disabled
        data._recompute(store, stored, ONLY_A, None)
        assert not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr(DailyRollups, "job_days", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        data._recompute(store, stored, ONLY_A, None)
    assert gc.isenabled()  # and enabled again when the recomputation fails


def test_a_day_of_readable_dags_only_is_the_stored_day(
        store: EttStore, fleet: F.Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _spy_reads(monkeypatch)
    scope = DagScope(all_dags=False, dag_ids=frozenset({F.DAG_A, "a_dag_of_no_job"}))
    day2, day3 = fleet.days[1], fleet.days[2]
    assert store.daily.dag_ids_of_day(day3.day) == {F.DAG_A}  # only A2 runs on day 3
    assert data.readable_day(store, day3, scope) is day3 and reads == []
    assert store.daily.dag_ids_of_day(fleet.days[0].day) == {F.DAG_A, None}  # C1: no DAG
    got = data.readable_day(store, day2, scope)  # B1 of the secret DAG ran on day 2
    assert [r[:2] for r in reads] == [("parts", day2.day)]
    assert got.fleet.jobs == 1 and day2.fleet.jobs == 2


def test_a_window_with_no_rollup_says_so(store: EttStore, fleet: F.Fleet,
                                         empty_store: EttStore) -> None:
    view = data.fleet(store, dt.date(2020, 1, 1), dt.date(2020, 1, 5), DagScope(all_dags=True))
    assert view.days == [] and view.latest is None
    assert "No rollup is stored for 2020-01-01 to 2020-01-05" in view.notes[0]
    assert f"The newest stored day is {fleet.days[-1].day}." in view.notes[0]
    view = data.fleet(empty_store, dt.date(2020, 1, 1), dt.date(2020, 1, 5), ONLY_A)
    assert view.notes[0].endswith("The store holds no rollup yet.")


def test_run_href_quotes_the_path_parts() -> None:
    assert data.run_href("d", "manual__2026-11-28T10:00:00+00:00") == (
        "runs/d/manual__2026-11-28T10%3A00%3A00%2B00%3A00")
    assert data.run_href("a/b", "c d") == "runs/a%2Fb/c%20d"
    assert data.run_href(None, "r") is None and data.run_href("d", None) is None
    assert data.run_href("d", "r", "d__r") == "runs/d/r"  # the job id the run's ids make
    assert data.run_href("d", "r", "sim-0 x") == "runs/d/r?job=sim-0%20x"


def test_a_finished_run_has_the_stores_figures(store: EttStore, fleet: F.Fleet) -> None:
    run = data.run(store, F.DAG_A, "scheduled__a1", now=fleet.now, figures=True)
    assert run is not None
    summary = store.job_summary(job_id_for(F.DAG_A, "scheduled__a1"), now=fleet.now)
    assert (run.ett_pct, run.e2e_s, run.effective_s) == (
        summary.ett_pct, summary.e2e_s, summary.effective_s)
    assert {c.component: c.seconds for c in run.level2} == summary.components
    assert sum(c.share_pct for c in run.level2) == pytest.approx(100.0)
    assert run.level1.tts_s == summary.tts_s and run.level1.ttr_s == summary.ttr_s
    assert run.level1.nof["infra"] == 1 and run.level1.attempts == 2
    assert [a.status for a in run.attempts] == ["failed", "success"]
    assert [f.cause for f in run.failures] == ["infra"]
    assert [p.uri for p in run.published] == [F.MODEL_URI]
    assert run.level1.model_available_after_release_s == pytest.approx(90.0)
    assert run.provisional is False and run.windows == []
    assert [p.seconds for p in run.phases] == sorted((p.seconds for p in run.phases),
                                                     reverse=True)
    assert run.timeline.rows == ["scheduling", "1", "2"]
    assert run.figures is not None and set(run.figures) == {"timeline"}


def test_a_running_run_is_provisional_with_its_rolling_windows(store: EttStore,
                                                               fleet: F.Fleet) -> None:
    run = data.run(store, F.DAG_A, fleet.running_run_id, now=fleet.now)
    assert run is not None and run.provisional and run.published == []
    assert run.ended_at == fleet.now and run.e2e_s == pytest.approx(7200.0)
    a = attribute_job(store.job_events(job_id_for(F.DAG_A, fleet.running_run_id)),
                      now=fleet.now)
    # the default [ett] rolling_windows: 5, 15 and 60 minutes, each cut from the same
    # attribution as the window of the same bounds would be
    assert [w.minutes for w in run.windows] == [5, 15, 60]
    for w in run.windows:
        clip = clip_to_window(a, fleet.now - 60 * w.minutes, fleet.now)
        assert (w.lo, w.hi) == (fleet.now - 60 * w.minutes, fleet.now)
        assert w.e2e_s == 60.0 * w.minutes  # the run is two hours old: every window is full
        assert w.ett_pct == clip.ett_pct and w.components_s == clip.components_s
        assert sum(w.components_s.values()) == pytest.approx(w.e2e_s)
    assert run.windows[-1].ett_pct != run.ett_pct  # the hour is not the whole run
    assert not any("rolling" in line for line in run.warnings)


def test_rolling_windows_come_from_the_setting_or_the_caller(
        store: EttStore, fleet: F.Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    running = (store, F.DAG_A, fleet.running_run_id)
    longer = data.run(*running, now=fleet.now, windows_min=[1, 240])
    assert longer is not None
    assert [(w.minutes, w.e2e_s) for w in longer.windows] == [(1, 60.0),
                                                             (240, pytest.approx(7200.0))]
    assert longer.windows[1].components_s == pytest.approx(
        {c.component: c.seconds for c in longer.level2})  # longer than the run: all of it
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_WINDOWS", "30")
    run = data.run(*running, now=fleet.now)
    assert run is not None and [w.minutes for w in run.windows] == [30]
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_WINDOWS", "")
    run = data.run(*running, now=fleet.now)
    assert run is not None and run.windows == []
    # a bad value costs only the windows, and the page says why in one line
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_WINDOWS", "5,fifteen")
    run = data.run(*running, now=fleet.now)
    assert run is not None and run.windows == [] and run.ett_pct > 0
    assert run.warnings[-1] == (
        "no rolling windows: [ett] rolling_windows must be whole minutes separated by commas, "
        "such as '5,15,60'; 'fifteen' is not, in '5,fifteen'")
    finished = data.run(store, F.DAG_A, "scheduled__a1", now=fleet.now)
    assert finished is not None and finished.windows == []  # nothing read for a finished run
    assert not any("rolling" in line for line in finished.warnings)


def test_a_run_silent_past_the_rollups_bound_says_so(store: EttStore, fleet: F.Fleet) -> None:
    events = store.job_events(job_id_for(F.DAG_A, fleet.running_run_id))
    quiet = fleet.now - max(e.ts for e in events)
    loud = data.run(store, F.DAG_A, fleet.running_run_id, now=fleet.now,
                    silent_after_s=quiet + 1)
    assert loud is not None and not any("no event for" in w for w in loud.warnings)
    quiet_run = data.run(store, F.DAG_A, fleet.running_run_id, now=fleet.now,
                         silent_after_s=quiet - 60)
    assert quiet_run is not None
    assert [w for w in quiet_run.warnings if w.startswith(
        f"no event for {quiet / 3600:.1f} h: the job may be abandoned")]
    off = data.run(store, F.DAG_A, fleet.running_run_id, now=fleet.now, silent_after_s=0)
    assert off is not None and off.warnings == loud.warnings
    ended = data.run(store, F.DAG_A, "scheduled__a1", now=fleet.now, silent_after_s=1)
    assert ended is not None and not any("no event for" in w for w in ended.warnings)


def test_a_run_is_found_only_under_its_own_dag(store: EttStore, fleet: F.Fleet) -> None:
    # ("ett_pages_ranking__scheduled", "a1") names the same job id as A1's: the job's own
    # DAG is ett_pages_ranking, so a user allowed that other DAG must not get A1 this way.
    assert job_id_for(F.DAG_A + "__scheduled", "a1") == job_id_for(F.DAG_A, "scheduled__a1")
    assert data.run(store, F.DAG_A + "__scheduled", "a1", now=fleet.now) is None
    assert data.run(store, F.DAG_A, "no_such_run", now=fleet.now) is None


def test_a_job_named_otherwise_is_found_by_its_id_under_its_own_run(empty_store: EttStore
                                                                    ) -> None:
    from airflow_ett.ett.synthetic import JobSpec, simulate

    empty_store.insert_events(simulate(JobSpec(job="sim-7-0001", dag_id="sim_ranking",
                                               run_id="sim__0001", submit_ts=F.NOW - 4000)))
    run = data.run(empty_store, "sim_ranking", "sim__0001", now=F.NOW, job="sim-7-0001")
    assert run is not None and run.job == "sim-7-0001"
    assert data.run(empty_store, "sim_ranking", "sim__0001", now=F.NOW) is None
    # the id of a job of another DAG (or run) finds nothing under this path
    assert data.run(empty_store, F.DAG_A, "sim__0001", now=F.NOW, job="sim-7-0001") is None
    assert data.run(empty_store, "sim_ranking", "other", now=F.NOW, job="sim-7-0001") is None


def test_the_fleet_page_names_a_broken_tenants_file(store: EttStore, fleet: F.Fleet,
                                                   tmp_path: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from airflow_ett.scheduling import tenants

    path = tmp_path / "tenants.toml"
    monkeypatch.setenv("AIRFLOW__ETT__TENANTS_FILE", str(path))
    tenants._CACHE.clear()
    view = lambda: data.fleet(store, fleet.first, fleet.last, DagScope(all_dags=True))  # noqa: E731
    assert view().notes[-1].startswith("No tenant policy is in force: tenants file ")
    path.write_text("[tenants.ads]\npriority = 1\nquota_gpus = 2\n", encoding="utf-8")
    os.utime(path, (1, 1))
    assert not any("tenant" in n for n in view().notes)  # valid: nothing to say
    path.write_text("[tenants.ads]\npriority = 1\nquota_gpus = -2\n", encoding="utf-8")
    os.utime(path, (2, 2))
    note = view().notes[-1]
    assert note.startswith("The tenants file is broken, so the version loaded at ")
    assert "quota_gpus: -2" in note
    monkeypatch.delenv("AIRFLOW__ETT__TENANTS_FILE")
    assert not any("tenant" in n for n in view().notes)


def test_the_headline_passes_over_days_where_nothing_had_finished() -> None:
    """Decision 0010: a day whose jobs all still ran (or that had none yet and was not
    over) when computed is not the headline while a day with finished work precedes it."""
    from tests.rollup.scenarios import issue_day_jobs

    def day(n: int, jobs: list[JobDay], *, done: bool) -> DayRollup:
        window = DayWindow(day=dt.date(2026, 11, n), tz="UTC", lo=n * 86400.0,
                           hi=(n + 1) * 86400.0)
        return rollup_day(window, jobs, load_components(),
                          computed_at=window.hi + 1 if done else window.hi - 1)

    finished = issue_day_jobs()
    running = [dataclasses.replace(d, provisional=True) for d in finished]
    mixed = [running[0], finished[1]]
    done, all_running = day(1, finished, done=True), day(2, running, done=False)
    empty_today, empty_past = day(3, [], done=False), day(3, [], done=True)
    assert data.headline_index([done, all_running]) == 0
    assert data.headline_index([done, all_running, empty_today]) == 0
    assert data.headline_index([done, empty_past]) == 1  # a quiet day that is over: none
    assert data.headline_index([done, day(2, mixed, done=False)]) == 1  # some finished
    assert data.headline_index([all_running]) == 0  # nothing else to show
    assert data.headline_index([]) == -1
