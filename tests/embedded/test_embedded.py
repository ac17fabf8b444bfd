"""The embedded Airflow harness: its configuration (fast), then one real Airflow (SQLite,
LocalExecutor, four component processes) shared by the end-to-end tests of this module,
which run in file order and end with the test that stops it and looks for leftovers."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.embedded import (
    SECRETS_FILE,
    DagImportError,
    EmbeddedAirflow,
    airflow_executable,
    login_info,
)
from airflow_ett.embedded.harness import runs_tasks
from tests.airflow_db import migrate

# --- configuration, no processes ----------------------------------------------------------


def test_env_points_every_component_at_one_home(tmp_path: Path) -> None:
    af = EmbeddedAirflow(tmp_path / "home", tmp_path / "dags", parallelism=3, api_port=18123)
    env = af.env
    home = (tmp_path / "home").resolve()
    assert env["AIRFLOW_HOME"] == str(home)
    assert env["AIRFLOW_CONFIG"] == str(home / "airflow.cfg")
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str((tmp_path / "dags").resolve())
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{home}/airflow.db"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:////")  # absolute
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__PARALLELISM"] == "3"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert (env["AIRFLOW__API__HOST"], env["AIRFLOW__API__PORT"]) == ("127.0.0.1", "18123")
    assert af.api_url == "http://127.0.0.1:18123"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18123/execution/"
    assert len(env["AIRFLOW__API_AUTH__JWT_SECRET"]) >= 64  # HS512: PyJWT warns below 64


def test_secrets_persist_in_home_and_extra_env_wins(tmp_path: Path) -> None:
    first = EmbeddedAirflow(tmp_path / "home", tmp_path / "dags")
    url = "postgresql+psycopg2://u:p@127.0.0.1/x"
    second = EmbeddedAirflow(tmp_path / "home", tmp_path / "dags",
                             extra_env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url})
    assert (tmp_path / "home" / SECRETS_FILE).stat().st_mode & 0o077 == 0
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY",
                "AIRFLOW__CORE__FERNET_KEY"):
        assert first.env[key] == second.env[key]
    from cryptography.fernet import Fernet  # a key Airflow's Fernet takes

    token = Fernet(first.env["AIRFLOW__CORE__FERNET_KEY"]).encrypt(b"kwargs")
    assert Fernet(second.env["AIRFLOW__CORE__FERNET_KEY"]).decrypt(token) == b"kwargs"
    assert second.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == url
    # A port is drawn when none is given; the log servers get their own.
    ports = {first.api_port, int(first.env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]),
             int(first.env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"])}
    assert len(ports) == 3 and all(1024 <= p < 65536 for p in ports)


def test_harness_does_not_import_airflow() -> None:
    code = "import sys, airflow_ett.embedded, airflow_ett.cli; print('airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_login_info_reads_the_generated_password(tmp_path: Path) -> None:
    assert "not generated yet" in login_info(tmp_path, "http://127.0.0.1:8080")
    (tmp_path / "simple_auth_manager_passwords.json.generated").write_text(
        json.dumps({"admin": "s3cret"}) + "\n")
    text = login_info(tmp_path, "http://127.0.0.1:8080")
    assert "http://127.0.0.1:8080" in text and "admin" in text and "s3cret" in text


def test_cli_rejects_bad_conf_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["embedded", "run", "x", "--home", str(tmp_path / "h"), "--dags-folder",
            str(tmp_path), "--conf"]
    assert main([*argv, "{not json"]) == 1
    assert "--conf is not JSON" in capsys.readouterr().err
    assert main([*argv, "[1, 2]"]) == 1
    assert "JSON object" in capsys.readouterr().err
    assert main(["embedded", "run", "x", "--dags-folder", str(tmp_path / "missing")]) == 1
    assert "dags folder not found" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


# --- a real Airflow ---------------------------------------------------------------------------

TWO_TASKS = """\
import pendulum
from airflow.sdk import DAG, task

with DAG("ett_embedded_ok", schedule=None, start_date=pendulum.datetime(2024, 1, 1)):
    @task
    def first() -> int:
        return 20

    @task
    def second(value: int) -> int:
        return value + 1

    second(first())
"""

FAILING = """\
import pendulum
from airflow.sdk import DAG
from airflow.providers.standard.operators.bash import BashOperator

with DAG("ett_embedded_fail", schedule=None, start_date=pendulum.datetime(2024, 1, 1)):
    BashOperator(task_id="fine", bash_command="true") >> BashOperator(
        task_id="boom", bash_command="exit 3", retries=0)
"""

# The words "airflow" and "DAG" must both be in a file, or the dag-processor skips it
# ([core] dag_discovery_safe_mode) and no import error is ever recorded.
BROKEN = """\
from airflow.sdk import DAG  # DAG "ett_embedded_broken" never loads: the next import fails.
import ett_no_such_module_anywhere
"""


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedAirflow]:
    try:
        airflow_executable()
    except Exception as exc:
        pytest.skip(f"no airflow executable: {exc}")
    root = tmp_path_factory.mktemp("embedded")
    dags = root / "dags"
    dags.mkdir()
    (dags / "ett_embedded_ok.py").write_text(TWO_TASKS)
    af = EmbeddedAirflow(root / "home", dags, parallelism=2)
    try:
        af.migrate()
        af.start()
        af.wait_until_ready(timeout=180)
        yield af
    finally:
        af.stop()


def _report(label: str, seconds: float) -> None:
    """Timings go to the test output (`-rA` or `-s` shows them)."""
    print(f"[embedded] {label}: {seconds:.1f} s")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_task_dag_succeeds(airflow: EmbeddedAirflow) -> None:
    _report("airflow db migrate", airflow.timings["migrate_s"])
    _report("components start to ready", airflow.timings["ready_s"])
    airflow.wait_for_dag("ett_embedded_ok", timeout=60)
    airflow.unpause("ett_embedded_ok")
    begin = time.monotonic()
    run_id = airflow.trigger("ett_embedded_ok", conf={"note": "from the test"})
    assert airflow.wait_for_run("ett_embedded_ok", run_id, timeout=180, poll=0.5) == "success"
    _report("two-task run, trigger to success", time.monotonic() - begin)
    tasks = airflow.task_instances("ett_embedded_ok", run_id)
    assert [(t["task_id"], t["state"], t["try_number"]) for t in tasks] == [
        ("first", "success", 1), ("second", "success", 1)]
    assert all(t["start_date"] and t["end_date"] for t in tasks)
    log = airflow.task_log_path("ett_embedded_ok", run_id, "first", 1)
    assert log.is_file(), f"no task log at {log}"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_failing_task_fails_the_run(airflow: EmbeddedAirflow) -> None:
    # Written while everything runs: the dag-processor must find a new file in seconds.
    (airflow.dags_folder / "ett_embedded_fail.py").write_text(FAILING)
    begin = time.monotonic()
    airflow.wait_for_dag("ett_embedded_fail", timeout=60)
    _report("new DAG file to DAG loaded", time.monotonic() - begin)
    airflow.unpause("ett_embedded_fail")
    run_id = airflow.trigger("ett_embedded_fail")
    assert airflow.wait_for_run("ett_embedded_fail", run_id, timeout=180, poll=0.5) == "failed"
    states = {t["task_id"]: t["state"] for t in airflow.task_instances("ett_embedded_fail", run_id)}
    assert states == {"fine": "success", "boom": "failed"}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_import_error_is_reported_with_its_text(airflow: EmbeddedAirflow) -> None:
    (airflow.dags_folder / "ett_embedded_broken.py").write_text(BROKEN)
    begin = time.monotonic()
    with pytest.raises(DagImportError, match="ett_no_such_module_anywhere"):
        airflow.wait_for_dag("ett_embedded_broken", timeout=60)
    assert time.monotonic() - begin < 30, "an import error must fail fast, not time out"


def _ps() -> dict[int, tuple[int, str]]:
    """pid -> (process group, state), from ps: what an operator would look at."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True,
                         check=True).stdout
    rows = (line.split() for line in out.splitlines() if line.strip())
    return {int(pid): (int(pgid), stat) for pid, pgid, stat in rows}


def _duration_us(access_line: str) -> int:
    """An access line's `duration_us=<n>`: from the request received to the line."""
    match = re.search(r"\bduration_us=(\d+)\b", access_line)
    assert match, access_line
    return int(match.group(1))


def _logged_at(line: str) -> datetime:
    """The time a log line begins with (ours: `=== <iso> airflow ...`; Airflow's: `<iso>Z`)."""
    return datetime.fromisoformat(line.removeprefix("=== ").split()[0].replace("Z", "+00:00"))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_scheduler_starts_once_the_execution_api_answers(
        airflow: EmbeddedAirflow) -> None:
    """A task's first act is a call to the execution API: what runs tasks starts after it
    answers (started together, a restart with runs queued failed their tasks' starts)."""
    assert [c for c in ("api-server", "dag-processor", "triggerer", "scheduler")
            if runs_tasks(c)] == ["scheduler"]
    assert runs_tasks("worker-gpu")  # a Celery worker, by a name of one's own
    api_log = (airflow.log_dir / "api-server.log").read_text().splitlines()
    # The access line is written after the response is sent, so its stamp may follow the
    # scheduler's start by the write; the request it answers began `duration_us` before.
    answered = [_logged_at(line) - timedelta(microseconds=_duration_us(line))
                for line in api_log
                if "path=/execution/health " in line and "status_code=200" in line]
    scheduler_log = (airflow.log_dir / "scheduler.log").read_text().splitlines()
    started = _logged_at(next(line for line in scheduler_log if line.startswith("=== ")))
    assert answered and answered[0] <= started, (answered[:1], started)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stop_leaves_no_process_behind(airflow: EmbeddedAirflow) -> None:
    groups = set(airflow.pids.values())
    tree = airflow.process_tree()
    assert groups <= set(tree)
    assert len(tree) > len(groups), "expected children (workers, log servers, ...)"
    begin = time.monotonic()
    airflow.stop(timeout=20)
    _report("stop", time.monotonic() - begin)
    running = {pid: info for pid, info in _ps().items() if "Z" not in info[1]}
    assert not set(tree) & set(running), textwrap.shorten(str(
        {pid: running[pid] for pid in set(tree) & set(running)}), 300)
    assert not [pid for pid, (pgid, _) in running.items() if pgid in groups]
    assert airflow.pids == {}
    airflow.stop()  # idempotent


def _db_contents(path: Path) -> dict[str, object]:
    """Schema and rows of a SQLite DB, without the rows' creation times."""
    with sqlite3.connect(path) as db:
        tables = {name: sql for name, sql in db.execute(
            "SELECT name, sql FROM sqlite_master ORDER BY name")}
        rows = {}
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cursor = db.execute(f'SELECT * FROM "{name}"')
            columns = [c[0] for c in cursor.description]
            rows[name] = sorted(
                repr({c: v for c, v in zip(columns, row, strict=True) if c != "created_at"})
                for row in cursor)
    return {"schema": tables, "rows": rows}


@pytest.mark.integration
def test_the_suites_migrated_template_is_what_migrate_makes(tmp_path: Path) -> None:
    """tests/airflow_db.py copies one migrated DB into each test Airflow: the copy must
    be what `airflow db migrate` makes for it, and settings it would write are honoured."""
    real = EmbeddedAirflow(tmp_path / "real" / "home", tmp_path / "dags")
    real.migrate()
    copied = EmbeddedAirflow(tmp_path / "copied" / "home", tmp_path / "dags")
    migrate(copied)
    assert _db_contents(copied.home / "airflow.db") == _db_contents(real.home / "airflow.db")
    assert _db_contents(copied.home / "ett.db") == _db_contents(real.home / "ett.db")
    # a setting that migrate writes into the DB: migrated for real, and it shows
    pools = EmbeddedAirflow(tmp_path / "pools" / "home", tmp_path / "dags", extra_env={
        "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT": "7"})
    migrate(pools)
    assert "'slots': 7" in str(_db_contents(pools.home / "airflow.db")["rows"])
