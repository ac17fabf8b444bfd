"""`airflow-ett report --compare A B` through `main(argv)` on a real SQLite store holding
the hand-made fortnight of tests/rollup/compare_days.py (figures worked out there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.rollup import load_components
from airflow_ett.store import EttStore, upgrade
from tests.rollup.compare_days import store_days

WEEKS = ["2026-11-01..2026-11-07", "2026-11-08..2026-11-14"]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('compare') / 'ett.db'}"
    upgrade(store_url)
    with EttStore(store_url) as store:
        store_days(store, load_components())
    return store_url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as done:  # argparse's usage errors
        code = done.code if isinstance(done.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_text_ranks_what_moved(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "report", "--compare", *WEEKS, "--store-url", url)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == [
        "windows 2026-11-01..2026-11-07 (7 days) -> 2026-11-08..2026-11-14 (7 days)",
        "fleet ETT% 95.8 -> 93.7 (-2.09 points)   GPU-h 389 -> 544   lost 16.33 -> 34.22   "
        "models 3 -> 3",
        "cohort (2 models in both) ETT% 97.2 -> 96.0 (-1.25 points)   GPU-h 311 -> 467   "
        "lost 8.56 -> 18.67   models 2 -> 2",
        "the fleet's change by model: cohort -0.99, entered -2.26 (1 model(s)), "
        "left +1.16 (1 model(s))",
    ]
    rows = [line.split() for line in lines]
    # as operated: initialization first (0.2% -> 1.4%), the five adding up to the change
    first = lines.index("the fleet as operated")
    assert rows[first + 2] == ["initialization", "0.2%", "1.4%", "-1.23"]
    assert ["ETT%", "change", "-2.09"] in rows
    assert ["fresh", "-2.26", "+0.00", "-2.26", "-", "80.0", "0.00", "77.78"] in rows
    assert ["rank", "platform", "search", "8", "->", "16", "98.0", "98.0", "156", "311",
            "+0.38"] in rows
    assert ["old", "left", "search", "4", "->", "-", "90.0", "-", "77.78", "0.00",
            "+1.16"] in rows
    cohort = lines.index("the fixed cohort (models that ran in both windows)")
    assert rows[cohort + 2] == ["initialization", "0.2%", "1.7%", "-1.42"]


def test_without_churn_the_cohort_is_not_shown_twice(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "report", "--compare", "2026-11-01..2026-11-03",
                       "2026-11-04..2026-11-07", "--store-url", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].startswith("fleet ETT% 95.8 -> 95.8 (+0.00 points)")
    assert lines[2] == ("cohort: all 3 models ran in both windows, so the fixed cohort is "
                        "the fleet as operated")
    assert "the fixed cohort (models that ran in both windows)" not in lines
    assert lines[-1] == "no model entered, left or changed platform (GPUs per job)"


def test_json_carries_every_split(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "report", "--compare", *WEEKS, "--format", "json",
                       "--store-url", url)
    assert code == 0
    c = json.loads(out)
    assert c["before"] == {"first": "2026-11-01", "last": "2026-11-07", "days": 7}
    change = c["fleet"]["change_points"]
    assert change == pytest.approx(262_400 / 2_800 - 95.8)
    for view in ("fleet", "cohort"):
        v = c[view]
        assert sum(m["ett_points"] for m in v["components"]) == pytest.approx(
            v["change_points"], abs=1e-9)
        for scope in ("tenants", "models"):
            assert sum(g["points"] for g in v[scope]) == pytest.approx(v["change_points"],
                                                                       abs=1e-9)
    assert [m["model"] for m in c["entered"]] == ["fresh"]
    assert [(m["model"], m["gpus_before"], m["gpus_after"]) for m in c["platform_changed"]] \
        == [("rank", [8], [16])]


def test_one_day_windows_and_windows_in_any_order(url: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "report", "--compare", "2026-11-14", "2026-11-01",
                       "--format", "json", "--store-url", url)
    assert code == 0
    c = json.loads(out)
    assert (c["before"]["days"], c["after"]["last"]) == (1, "2026-11-01")
    assert c["fleet"]["change_points"] == pytest.approx(95.8 - 262_400 / 2_800)


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--compare", "2026-11-07..2026-11-01", WEEKS[1]], 2,
     "argument --compare: '2026-11-07..2026-11-01': its first day 2026-11-07 is after its "
     "last 2026-11-01"),
    (["--compare", "2026-11-01..2026-13-07", WEEKS[1]], 2,
     "argument --compare: '2026-11-01..2026-13-07': '2026-13-07' is not a date "
     "(YYYY-MM-DD); a window is D1..D2"),
    (["--compare", "2026-11-01..2100-01-01", WEEKS[1]], 2,
     "argument --compare: '2026-11-01..2100-01-01': 2100-01-01 is not a day events can fall "
     "in (2000-01-01 to 2099-12-31); a window is D1..D2"),
    (["--compare", "2026-01-01..2027-12-31", WEEKS[1]], 2,
     "argument --compare: '2026-01-01..2027-12-31': 730 days; at most 366 in a window"),
    (["--compare", WEEKS[0]], 2, "argument --compare: expected 2 arguments"),
    (["--compare", "2026-10-30..2026-11-07", WEEKS[1]], 1,
     "--compare: 2026-10-30..2026-11-07: 2 of its 9 days not rolled up (2026-10-30, "
     "2026-10-31): run `airflow-ett rollup --from 2026-10-30 --to 2026-10-31` first"),
    (["--compare", *WEEKS, "--format", "html"], 1,
     "--format: 'html' is not a --compare format: text or json"),
    (["--compare", *WEEKS, "--date", "2026-11-02"], 1,
     "--date: not with --compare, which names its own days and shows the whole fleet"),
    (["--compare", *WEEKS, "--tz", "UTC"], 1,
     "--tz: not with --compare, which names its own days and shows the whole fleet"),
    (["--compare", *WEEKS, "--tenant", "ads"], 1,
     "--tenant: not with --compare, which names its own days and shows the whole fleet"),
])
def test_a_bad_window_is_one_line_naming_it(url: str, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], code: int, message: str) -> None:
    got, out, err = run(capsys, "report", *argv, "--store-url", url)
    assert (got, out) == (code, "")
    assert err.splitlines()[-1].endswith(f"error: {message}"), err
    assert "Traceback" not in err


def test_days_stored_before_parts_counted_gpus_are_read_from_their_job_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store whose parts predate `gpu_counts` (their JSON without it) still finds rank's
    move from 8 to 16 GPUs: those days' parts are made again from their job rows."""
    import sqlalchemy as sa

    from airflow_ett.store.schema import daily_groups

    store_url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(store_url)
    with EttStore(store_url) as store:
        store_days(store, load_components())
        with store.engine.begin() as conn:
            rows = conn.execute(sa.select(daily_groups.c.day, daily_groups.c.key,
                                          daily_groups.c.payload)
                                .where(daily_groups.c.scope == "part")).all()
            for day, key, payload in rows:
                old = json.loads(payload)
                del old["gpu_counts"]
                conn.execute(sa.update(daily_groups)
                             .where(daily_groups.c.day == day, daily_groups.c.key == key,
                                    daily_groups.c.scope == "part")
                             .values(payload=json.dumps(old)))
        assert all(not p.gpu_counts for p in store.daily.parts("2026-11-01"))
    code, out, _ = run(capsys, "report", "--compare", *WEEKS, "--format", "json",
                       "--store-url", store_url)
    assert code == 0
    c = json.loads(out)
    assert [m["model"] for m in c["platform_changed"]] == ["rank"]
    assert c["platform_unknown"] == []
    assert c["fleet"]["change_points"] == pytest.approx(262_400 / 2_800 - 95.8)
