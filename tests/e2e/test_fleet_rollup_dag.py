"""The nightly rollup DAG on a real Airflow (scheduler, dag-processor, API server; SQLite,
LocalExecutor): unpaused, it catches up on the two days its settings allow, writes their
rows and reports; a manual rerun of one day after late events corrects that day; a
backfill of three earlier days (`airflow backfill create`) runs and stores every one (a
month of days, run after run, is tests/operators/test_rollup_task.py: the same callable).

The store holds the hand-computed jobs of tests/rollup/scenarios.py, placed on the two
days before today (UTC): job A across their midnight, job B on the second day. Figures
worked out in tests/rollup/test_day.py.

Alerts: the components file (the bundled SLOs) names a notifier whose class lives beside
the DAG (a real `BaseNotifier` that appends what it was asked to send to a file): each
run alerts its own day (both days miss ETT% >= 90), and the rerun of a day sends nothing
it sent before.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.embedded import EmbeddedAirflow, venv_script
from airflow_ett.rollup import DayRollup, day_window
from airflow_ett.rollup.components import default_components_file
from airflow_ett.store import EttStore, upgrade
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER
from tests.rollup.scenarios import job_a, job_b, late_job

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "ett_fleet_rollup.py"
DAG_ID = "ett_fleet_rollup"


def _runs(af: EmbeddedAirflow) -> list[dict[str, Any]]:
    body = af.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=50&order_by=logical_date")
    return list(body.get("dag_runs", []))


#: Days backfilled through Airflow (each a task process; a month is the unit test's).
BACKFILL_DAYS = 3


def _wait_for_finished_runs(af: EmbeddedAirflow, count: int, timeout: float) -> list[dict]:
    def finished() -> list[dict[str, Any]]:
        runs = _runs(af)
        done = len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs)
        return runs if done else []

    return list(af.wait_until(f"{count} finished runs", finished, timeout=timeout, poll=2.0))


def _backfill(af: EmbeddedAirflow, today: dt.date) -> tuple[dt.date, dt.date]:
    """`airflow backfill create` over BACKFILL_DAYS days well before the DAG's bounded
    catchup start, run to the end by the scheduler; returns the first and last day.

    The backfill is created while Airflow's components are stopped: on SQLite a scheduler
    writing at the same moment makes the creation fail with "database is locked", and the
    scheduler then dies on the half-made runs (seen on Debian's 3.11.2). A deployment on
    PostgreSQL has no such contention."""
    first_day = today - dt.timedelta(days=6 + BACKFILL_DAYS - 1)
    last_day = today - dt.timedelta(days=6)
    af.stop()
    done = subprocess.run(
        [str(venv_script("airflow")), "backfill", "create", "--dag-id", DAG_ID,
         "--from-date", first_day.isoformat(), "--to-date", last_day.isoformat(),
         "--max-active-runs", "2"],
        env=af.env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    af.start(WITHOUT_TRIGGERER)
    af.wait_until_ready(180.0)
    backfilled = _wait_for_finished_runs(af, 2 + 1 + BACKFILL_DAYS, timeout=300.0)
    states = {r["data_interval_start"][:10]: r["state"] for r in backfilled
              if r["run_type"] == "backfill"}
    assert len(states) == BACKFILL_DAYS and set(states.values()) == {"success"}, states
    return first_day, last_day


NOTIFIER = '''
import json
from airflow.sdk import BaseNotifier

class AlertLog(BaseNotifier):
    template_fields = ("subject", "text")

    def __init__(self, path, subject="", text=""):
        super().__init__()
        self.path, self.subject, self.text = path, subject, text

    def notify(self, context):
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"key": context["ett_alert"].key, "subject": self.subject,
                                  "text": self.text}) + "\\n")
'''


def _alerts_sent(log: Path) -> list[dict[str, str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _alerting_components(tmp_path: Path, dags: Path) -> tuple[Path, Path]:
    """A components file (the bundled SLOs) whose alerts go to the `AlertLog` notifier
    beside the nightly DAG, both put in `dags`; returns it and the file the notifier
    appends to."""
    dags.mkdir()
    shutil.copy(DAG_FILE, dags / DAG_FILE.name)
    (dags / "ett_alert_log.py").write_text(NOTIFIER, encoding="utf-8")
    alert_log = tmp_path / "alerts.jsonl"
    components = tmp_path / "components.toml"
    components.write_text(default_components_file().read_text(encoding="utf-8") + f'''
[alerts]
notify = ["log"]
fleet_url = "https://airflow.example.com/ett/"
[notifiers.log]
class = "ett_alert_log.AlertLog"
path = "{alert_log}"
''', encoding="utf-8")
    return components, alert_log


def _check_each_night_alerted_its_day(log: Path, day1: dt.date, day2: dt.date) -> list[str]:
    """Both days miss ETT% >= 90: each run alerted its own day, once; the keys sent."""
    sent = _alerts_sent(log)
    keys = [a["key"] for a in sent]
    assert f"{day1}/effective_training" in keys and f"{day2}/effective_training" in keys
    assert len(keys) == len(set(keys))
    ett2 = next(a for a in sent if a["key"] == f"{day2}/effective_training")
    assert ett2["subject"].startswith(f"[ETT] effective_training SLO breached on {day2}: "
                                      "88.24% (SLO >=90%")
    assert ett2["text"].endswith(f"fleet page: https://airflow.example.com/ett/?from="
                                 f"{day2}&to={day2}\n")
    return keys


def _check_slow_steps(day: DayRollup, report: Path) -> None:
    """Slow steps by day, computed in the DAG's task (decision 0035): A and B step at
    their ideal, so none lost, and known (None would be a day stored without them)."""
    assert (day.fleet.gpu_hours_lost_to_slow_steps,
            day.fleet.slow_steps_pct_of_effective) == (0.0, 0.0)
    assert "slow steps: 0.00 GPU-h lost inside effective training" in report.read_text()


def test_the_nightly_dag_catches_up_writes_reports_and_reruns_a_day(tmp_path: Path) -> None:
    today = dt.datetime.now(dt.UTC).date()
    day1, day2 = today - dt.timedelta(days=2), today - dt.timedelta(days=1)
    lo2 = day_window(day2, "UTC").lo  # job A starts an hour before it, on day 1
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    with EttStore(url) as store:
        store.insert_events([*job_a(lo2), *job_b(lo2)])
    dags = tmp_path / "dags"
    components, alert_log = _alerting_components(tmp_path, dags)
    reports = tmp_path / "reports"
    env = {"AIRFLOW__ETT__STORE_URL": url, "AIRFLOW__ETT__REPORT_DIR": str(reports),
           "AIRFLOW__ETT__ROLLUP_TIMEZONE": "UTC", "AIRFLOW__ETT__ROLLUP_CATCHUP_DAYS": "2",
           "AIRFLOW__ETT__ROLLUP_RECOMPUTE_DAYS": "2",
           "AIRFLOW__ETT__COMPONENTS_FILE": str(components)}
    with EmbeddedAirflow(tmp_path / "home", dags, extra_env=env) as af:
        migrate(af)
        af.start(WITHOUT_TRIGGERER)
        af.wait_until_ready(180.0)
        af.wait_for_dag(DAG_ID, timeout=120.0)
        af.unpause(DAG_ID)
        runs = _wait_for_finished_runs(af, 2, timeout=300.0)
        assert [r["state"] for r in runs] == ["success", "success"], runs
        assert sorted(r["data_interval_start"][:10] for r in runs) == [
            day1.isoformat(), day2.isoformat()]

        with EttStore(url) as store:
            first, second = store.daily.day(day1.isoformat()), store.daily.day(day2.isoformat())
            assert first is not None and second is not None
            assert (first.fleet.jobs, first.fleet.e2e_s, first.fleet.effective_s) == (
                1, 3600.0, 3000.0)  # A's hour before midnight
            assert (second.fleet.jobs, second.fleet.e2e_s, second.fleet.effective_s) == (
                2, 5500.0, 4500.0)
            assert second.fleet.gpu_hours == pytest.approx((3000 * 2 + 2500) / 3600)
            assert second.fleet.nof["infra"] == 1
        for day in (day1, day2):
            folder = reports / day.isoformat()
            assert {p.name for p in folder.iterdir()} >= {"report.txt", "report.json",
                                                         "report.csv", "index.html"}
        # GPU-weighted (decision 0010): day 2 is 100 x 7,500 / 8,500 GPU-s = 88.2, day 1
        # (A's hour, 2 GPUs) 100 x 6,000 / 7,200 = 83.3, so +4.9
        assert (reports / day2.isoformat() / "report.txt").read_text().startswith(
            "fleet ETT% 88.2 (+4.9)   jobs 2")
        _check_slow_steps(second, reports / day2.isoformat() / "report.txt")
        keys = _check_each_night_alerted_its_day(alert_log, day1, day2)

        # Late events for day 2 arrive; rerunning that day corrects it, nothing doubles.
        with EttStore(url) as store:
            store.insert_events(late_job(lo2))
        run_id = af.trigger(DAG_ID, conf={"date": day2.isoformat()})
        assert af.wait_for_run(DAG_ID, run_id, timeout=240.0) == "success"
        again = [a["key"] for a in _alerts_sent(alert_log)]
        assert again[:len(keys)] == keys and len(again) == len(set(again))  # none twice

        first_day, last_day = _backfill(af, today)
    with EttStore(url) as store:
        corrected = store.daily.day(day2.isoformat())
        assert corrected is not None
        assert (corrected.fleet.jobs, corrected.fleet.e2e_s) == (3, 6500.0)
        assert corrected.fleet.nof["application"] == 1
        assert len(store.daily.job_rows(day2.isoformat())) == 3
        # recompute_days=2: the rerun of day 2 recomputed day 1 too, which did not change
        again = store.daily.day(day1.isoformat())
        assert again is not None and again.fleet == first.fleet
        stored = store.daily.days(first_day.isoformat(), last_day.isoformat())
        assert len(stored) == BACKFILL_DAYS and {d.fleet.jobs for d in stored} == {0}
    assert all((reports / d.day / "index.html").is_file() for d in stored)
