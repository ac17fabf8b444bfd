"""`airflow-ett rollup` and `airflow-ett report` through `main(argv)` on a real SQLite store
holding the hand-computed jobs of tests/rollup/scenarios.py (figures in test_day.py)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.rollup import day_of
from airflow_ett.store import EttStore, upgrade
from tests.rollup.scenarios import job_a, job_b, slow_job


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW__ETT__REPORT_DIR", str(tmp_path / "reports"))
    store_url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(store_url)
    with EttStore(store_url) as store:
        store.insert_events([*job_a(), *job_b()])
    return store_url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_rollup_then_the_text_report(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "rollup", "--from", "2026-11-27", "--to", "2026-11-28",
                       "--store-url", url)
    assert code == 0
    assert out.splitlines() == [
        "2026-11-27 (UTC): fleet ETT% 83.3   jobs 1   GPU-h 2.00   lost 0.33",
        "2026-11-28 (UTC): fleet ETT% 88.2   jobs 2   GPU-h 2.36   lost 0.28",
    ]
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--store-url", url)
    assert code == 0 and "\x1b" not in out
    lines = out.splitlines()
    # 7500 / 8500 effective GPU-s (A: 3000 s x 2 GPUs, B: 1500 of 2500 s on 1), 4.9
    # points above the day before (3000 / 3600)
    assert lines[0] == ("fleet ETT% 88.2 (+4.9)   jobs 2   GPU-h 2.36   lost 0.28   "
                        "day 2026-11-28 (UTC)")
    assert any(line.split() == ["wasted_training", "7.1%", "0.17", "checkpoint-team", "<3%",
                                "BREACH"] for line in lines)
    assert any(line.split() == ["initialization", "0.0%", "0.00", "trainer-team", "<1%", "ok"]
               for line in lines)
    assert ("failures per attempt: 0.500 (0.500 without preemption); NoF 1 (infra 1); "
            "preemptions 0; attempts per job 2.00") in lines
    assert "cut wasted_training by 50%" in out and "91.5" in out  # 7500 / 8200
    # Level 3 inside effective training: their steps ran at their ideal pace
    assert ("slow steps: 0.00 GPU-h lost inside effective training (0.0% of it; in ETT%, "
            "not in lost)") in lines
    assert any(line.split()[:3] == ["b", "t2", "0.28"] for line in lines)


def test_a_range_shows_the_trend_and_a_tenant_only_its_figures(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "rollup", "--from", "2026-11-27", "--to", "2026-11-28", "--store-url", url)
    code, out, _ = run(capsys, "report", "--from", "2026-11-27", "--to", "2026-11-28",
                       "--store-url", url)
    assert code == 0
    trend = out.split("\n\n")[0].splitlines()
    assert trend[0].split()[-2:] == ["slow", "steps"]
    assert trend[1].split() == ["2026-11-27", "83.3", "1", "2.00", "0.33", "0.00"]
    assert trend[2].split() == ["2026-11-28", "88.2", "+4.9", "2", "2.36", "0.28", "0.00"]
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--tenant", "t1",
                       "--store-url", url)
    assert code == 0 and out.startswith("tenant t1 ETT% 100.0 (+16.7)   jobs 1")
    # judged by the tenant's own share: the fleet's 88.2% breaches >=90%, t1's 100% does not
    assert any(line.split() == ["effective_training", "100.0%", "-", "ml-platform", ">=90%",
                                "ok"] for line in out.splitlines())
    assert "what-if" not in out  # a fleet-only part
    assert not any(line.split()[:1] == ["b"] for line in out.splitlines())  # the other tenant


def test_json_and_csv_carry_the_same_figures(url: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "rollup", "--date", "2026-11-28", "--store-url", url)
    _, out, _ = run(capsys, "report", "--date", "2026-11-28", "--format", "json",
                    "--store-url", url)
    (day,) = json.loads(out)
    assert day["fleet"]["e2e_s"] == 5500.0 and day["fleet"]["nof"]["infra"] == 1
    assert day["tenants"]["t1"]["gpu_hours"] == pytest.approx(6000 / 3600)
    _, out, _ = run(capsys, "report", "--date", "2026-11-28", "--format", "csv",
                    "--store-url", url)
    rows = list(csv.DictReader(io.StringIO(out)))
    figures = {(r["scope"], r["key"], r["metric"]): r["value"] for r in rows}
    assert float(figures["fleet", "", "e2e_s"]) == 5500.0
    assert float(figures["fleet", "", "components_s.wasted_training"]) == 600.0
    assert float(figures["tenant", "t1", "gpu_hours"]) == pytest.approx(6000 / 3600)
    assert figures["slo", "wasted_training", "status"] == "breach"
    assert float(figures["top_run", "b", "gpu_hours_lost"]) == pytest.approx(1000 / 3600)
    _, out, _ = run(capsys, "report", "--date", "2026-11-28", "--format", "json",
                    "--tenant", "t2", "--store-url", url)
    (only,) = json.loads(out)
    assert only["tenant"] == "t2" and only["figures"]["ett_pct"] == pytest.approx(60.0)


def test_the_reports_show_the_gpu_hours_lost_to_slow_steps(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Job s (4 GPUs, tenant t1, model m2) lost 1000 s to slow steps, 2/3 of it allotted
    to 2026-11-28 by its effective time there (tests/rollup/test_slow_steps_days.py)."""
    with EttStore(url) as store:
        store.insert_events(slow_job())
    run(capsys, "rollup", "--from", "2026-11-27", "--to", "2026-11-28", "--store-url", url)
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--store-url", url)
    # 4 x 666.666667 GPU-s; of the day's 4 x 4000 + 2 x 3000 + 1500 effective GPU-s
    assert code == 0
    assert ("slow steps: 0.74 GPU-h lost inside effective training (11.3% of it; in ETT%, "
            "not in lost); most: tenant t1 0.74, model m2 0.74") in out.splitlines()
    _, out, _ = run(capsys, "report", "--from", "2026-11-27", "--to", "2026-11-28",
                    "--format", "json", "--store-url", url)
    before, day = json.loads(out)
    assert day["fleet"]["gpu_hours_lost_to_slow_steps"] == pytest.approx(4 * 666.666667 / 3600)
    assert day["models"]["m2"]["slow_steps_pct_of_effective"] == pytest.approx(
        100 * 666.666667 / 4000)
    assert day["tenants"]["t2"]["gpu_hours_lost_to_slow_steps"] == 0.0
    # the two days hold the job's whole loss, to the GPU-microsecond
    both = before["fleet"]["gpu_hours_lost_to_slow_steps"] + \
        day["fleet"]["gpu_hours_lost_to_slow_steps"]
    assert round(both * 3600 * 10**6) == 4 * 1000 * 10**6
    _, out, _ = run(capsys, "report", "--date", "2026-11-28", "--format", "csv",
                    "--store-url", url)
    figures = {(r["scope"], r["key"], r["metric"]): r["value"]
               for r in csv.DictReader(io.StringIO(out))}
    assert float(figures["tenant", "t1", "gpu_hours_lost_to_slow_steps"]) == pytest.approx(
        4 * 666.666667 / 3600)
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--tenant", "t1",
                       "--store-url", url)
    assert code == 0 and any(line.startswith("slow steps: 0.74 GPU-h lost") and "most" not in line
                             for line in out.splitlines())


def test_reports_can_be_written_to_a_directory(url: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "rollup", "--date", "2026-11-28", "--store-url", url)
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--format", "csv",
                       "--out", str(tmp_path / "r"), "--store-url", url)
    assert code == 0 and out == f"report: {tmp_path / 'r' / 'report.csv'}\n"
    assert (tmp_path / "r" / "report.csv").read_text().startswith("day,scope,key,metric,value")


@pytest.mark.parametrize(("argv", "message"), [
    (["report", "--date", "2026-11-20"],
     "no rollup stored for 2026-11-20: run `airflow-ett rollup --date 2026-11-20` first"),
    (["report", "--from", "2026-11-20", "--to", "2026-11-21"],
     "run `airflow-ett rollup --from 2026-11-20 --to 2026-11-21` first"),
    (["rollup", "--date", "2026-11-20", "--from", "2026-11-20", "--to", "2026-11-21"],
     "--date: give one day, or a range with --from and --to, not both"),
    (["rollup", "--from", "2026-11-20"], "--from/--to: a range needs both"),
    (["rollup", "--from", "2026-11-21", "--to", "2026-11-20"],
     "--to: 2026-11-20 is before --from 2026-11-21"),
    (["rollup", "--tz", "Mars/Olympus"], "--tz: timezone: unknown time zone 'Mars/Olympus'"),
])
def test_bad_requests_get_one_line_naming_the_option(
        url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = run(capsys, *argv, "--store-url", url)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1


def test_an_unknown_tenant_and_a_bad_components_file_are_named(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run(capsys, "rollup", "--date", "2026-11-28", "--store-url", url)
    code, _, err = run(capsys, "report", "--date", "2026-11-28", "--tenant", "nobody",
                       "--store-url", url)
    assert code == 1 and "--tenant: 'nobody' ran no job" in err
    bad = tmp_path / "c.toml"
    bad.write_text("[components.shutdwn]\n")
    monkeypatch.setenv("AIRFLOW__ETT__COMPONENTS_FILE", str(bad))
    code, _, err = run(capsys, "rollup", "--date", "2026-11-28", "--store-url", url)
    assert code == 1 and "component 'shutdwn': unknown component" in err
    before = EttStore(url).daily.day("2026-11-28")
    assert before is not None and before.fleet.jobs == 2  # the stored day is untouched


def test_the_default_day_is_yesterday_in_the_time_zone(
        url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__ETT__ROLLUP_TIMEZONE", "Pacific/Kiritimati")  # UTC+14
    code, out, _ = run(capsys, "rollup", "--store-url", url)
    yesterday = day_of(time.time(), "Pacific/Kiritimati") - dt.timedelta(days=1)
    assert code == 0 and out.startswith(f"{yesterday.isoformat()} (Pacific/Kiritimati):")


def test_the_html_report_goes_to_the_report_dir_with_the_worst_runs_timelines(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "rollup", "--from", "2026-11-27", "--to", "2026-11-28", "--store-url", url)
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--format", "html",
                       "--store-url", url)
    index = tmp_path / "reports" / "2026-11-28" / "index.html"
    assert code == 0 and out == f"report: {index}\n"
    page = index.read_text()
    assert "88.2" in page and "+4.9" in page  # the change from the stored day before
    assert "timeline-0" in page  # job b, the one run that lost GPU time, drawn
    assert "http://" not in page and "https://" not in page
    code, out, _ = run(capsys, "report", "--date", "2026-11-28", "--store-url", url)
    assert out.rstrip().endswith(f"report: {index}")  # the text report points at it
    code, _, err = run(capsys, "report", "--date", "2026-11-28", "--format", "html",
                       "--tenant", "t1", "--store-url", url)
    assert code == 1 and "--tenant: the HTML report shows the whole fleet" in err
