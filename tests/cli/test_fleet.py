"""`airflow-ett fleet simulate` against a real SQLite store: the output says SYNTHETIC, the
jobs carry the mark through to their summaries and the day's rollup, every job ends, the
counts it prints agree with each other and with the store, a rerun adds nothing, and a
clash with another fleet of the same seed is refused before any write."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.rollup import day_of, day_window, load_components
from airflow_ett.rollup.simulate import default_start, fleet_horizon
from airflow_ett.store import EttStore, upgrade

START = dt.date(2026, 11, 20)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ett.db"
    upgrade(url)
    return url


def simulate(url: str, *extra: str, days: int = 2, jobs: int = 25, seed: int = 3) -> list[str]:
    return ["fleet", "simulate", "--days", str(days), "--jobs-per-day", str(jobs),
            "--seed", str(seed), "--store-url", url, *extra]


def jobs_written(out: str, err: str) -> tuple[int, int, int]:
    """(jobs the progress counted, its total, jobs the summary says)."""
    progress = re.search(r"synthetic jobs: ([\d,]+)/([\d,]+)", err)
    summary = re.search(r"^  jobs    ([\d,]+) over ", out, re.MULTILINE)
    assert progress and summary, (out, err)
    return (int(progress[1].replace(",", "")), int(progress[2].replace(",", "")),
            int(summary[1].replace(",", "")))


def counts(out: str) -> tuple[int, int]:
    """(events, new events) from the summary."""
    found = re.search(r"^  events  ([\d,]+): ([\d,]+) new, ", out, re.MULTILINE)
    assert found, out
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


def test_writes_a_marked_fleet_once(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = simulate(url, "--start", START.isoformat(), "--tz", "UTC")
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(
        "airflow-ett: writing a SYNTHETIC fleet (simulated jobs, not measurements): "
        "2 day(s) 2026-11-20..2026-11-21 (UTC), 25 jobs/day, seed 3")
    assert "every job is marked synthetic" in out
    # the progress (plain off a terminal, on stderr) and the summary count the same jobs
    assert jobs_written(out, err) == (50, 50, 50)
    events, new = counts(out)
    assert events == new > 0

    with EttStore(url) as store:
        assert store.count_events() == events
        runs = store.list_runs(limit=1000)
        assert len(runs) == 50
        assert all(r.job.startswith("sim-3-") for r in runs)
        assert all(r.dag_id is not None and r.dag_id.startswith("sim_") for r in runs)
        assert {str(r.status) for r in runs} <= {"success", "failed", "cancelled"}
        horizon = fleet_horizon(START, 2, "UTC").hi
        summaries = [store.job_summary(r.job, now=horizon) for r in runs]
        assert all(s.synthetic is True for s in summaries)
        assert not any(s.provisional for s in summaries)  # every job ended
        assert max(s.ended_at for s in summaries) > horizon  # late ones past the last day

    assert main(argv) == 0  # the same fleet again: every event is already there
    out = capsys.readouterr().out
    assert counts(out) == (events, 0)
    assert f"{events:,} already there" in out
    with EttStore(url) as store:
        assert store.count_events() == events


def test_a_day_of_the_fleet_rolls_up_as_synthetic(url: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(simulate(url, "--start", START.isoformat(), "--tz", "Europe/Berlin",
                         days=2, jobs=40)) == 0
    capsys.readouterr()
    horizon = fleet_horizon(START, 2, "Europe/Berlin").hi
    with EttStore(url) as store:
        first = store.daily.compute_day(day_window(START, "Europe/Berlin"),
                                        load_components(), now=horizon)
        second = store.daily.compute_day(day_window(START + dt.timedelta(days=1),
                                                    "Europe/Berlin"),
                                         load_components(), now=horizon)
    assert first.fleet.jobs == 40 == first.synthetic_jobs
    assert not first.provisional
    # The second day also holds first-day jobs that ran past midnight; its own late jobs
    # run past its end, and have ended there too: nothing is provisional.
    assert second.synthetic_jobs == second.fleet.jobs > 40
    assert not second.provisional
    assert set(first.tenants) >= {"ads-ranking", "feed-recs"}
    assert 0 < first.fleet.ett_pct < 100


def test_the_default_fleet_has_ended_by_now(url: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    began = time.time()
    assert main(simulate(url, "--tz", "UTC", days=3, jobs=2)) == 0
    out, err = capsys.readouterr()
    first = out.splitlines()[0]
    lasts = {default_start(3, t, "UTC") + dt.timedelta(days=2) for t in (began, time.time())}
    assert any(f"{d - dt.timedelta(days=2)}..{d} (UTC)" in first for d in lasts), first
    assert all(d < day_of(began, "UTC") for d in lasts)
    assert "future" not in err
    with EttStore(url) as store:
        ended = [store.job_summary(r.job, now=began) for r in store.list_runs()]
    assert len(ended) == 6
    assert all(not s.provisional and s.ended_at <= began for s in ended)


def test_a_fleet_ending_after_now_says_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    today = day_of(time.time(), "UTC")
    assert main(simulate(url, "--tz", "UTC", "--start", today.isoformat(), days=1,
                         jobs=2)) == 0
    assert "some synthetic events lie in the future" in capsys.readouterr().err


def test_same_seed_in_another_zone_is_refused_before_writing(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(simulate(url, "--start", START.isoformat(), "--tz", "UTC", jobs=5)) == 0
    with EttStore(url) as store:
        before = store.count_events()
    capsys.readouterr()
    assert main(simulate(url, "--start", START.isoformat(), "--tz", "Asia/Tokyo",
                         jobs=5)) == 1
    err = capsys.readouterr().err
    assert "already holds synthetic job 'sim-3-2026-11-20-00000' with other content" in err
    assert "use another --seed" in err
    with EttStore(url) as store:
        assert store.count_events() == before
    # Another seed is another fleet: it goes in beside the first.
    assert main(simulate(url, "--start", START.isoformat(), "--tz", "Asia/Tokyo", jobs=5,
                         seed=4)) == 0


@pytest.mark.parametrize(("option", "value"), [
    ("--days", "0"), ("--days", "367"), ("--jobs-per-day", "100001"), ("--seed", "-1"),
    ("--jobs-per-day", "many"), ("--start", "2026-13-01"),
])
def test_bad_options_are_usage_errors(url: str, option: str, value: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*simulate(url), option, value])
    assert info.value.code == 2
    assert f"argument {option}:" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--start", "2099-12-30"], "--start: 2099-12-30 with days: 2 leaves"),
    (["--tz", "Mars/Olympus"], "--tz: timezone: unknown time zone 'Mars/Olympus'"),
])
def test_bad_values_are_one_line(url: str, argv: list[str], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*simulate(url), *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_store_without_schema_is_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"sqlite:///{tmp_path}/none.db"
    assert main(simulate(missing, "--start", START.isoformat(), "--tz", "UTC")) == 1
    out, err = capsys.readouterr()
    assert out.startswith("airflow-ett: writing a SYNTHETIC fleet")
    assert err.startswith("airflow-ett: error: ") and "airflow-ett db upgrade" in err
