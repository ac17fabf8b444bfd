"""The listener on a real Airflow when the ETT store is down and one of its hooks raises.

The DAG must still succeed; what the listener recorded waits in the spool and reaches the
store, exactly once, when `airflow-ett spool replay` runs after the store is back. The
fault comes from a plugin in the plugins folder, which every Airflow process loads: it
makes the listener's task-instance capture raise for the `success` state.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from airflow_ett.embedded import EmbeddedAirflow, venv_script
from airflow_ett.ett.events import JobSubmitted, TaskStateChanged
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

DAG = '''
from airflow.sdk import DAG, task

with DAG("ett_tiny", schedule=None, tags=["ett", "ett:tenant=t", "ett:model=none"]):
    @task
    def hello() -> int:
        return 1

    hello()
'''

FAULT_PLUGIN = '''
"""Test fault: the ETT listener's capture raises for task instances in state success."""
from airflow.plugins_manager import AirflowPlugin

import airflow_ett.plugin.listeners as listeners

_real = listeners._task_try


def _failing(previous_state, ti, state=None, error=None):
    if state == "success":
        raise RuntimeError("injected listener fault")
    return _real(previous_state, ti, state, error)


listeners._task_try = _failing


class EttFaultPlugin(AirflowPlugin):
    name = "ett_fault_injection"
'''


def test_dag_succeeds_with_the_store_down_and_a_hook_raising(tmp_path: Path) -> None:
    dags, plugins = tmp_path / "dags", tmp_path / "plugins"
    dags.mkdir()
    plugins.mkdir()
    (dags / "ett_tiny.py").write_text(textwrap.dedent(DAG))
    (plugins / "ett_fault.py").write_text(textwrap.dedent(FAULT_PLUGIN))
    home = tmp_path / "home"
    dead_store = "postgresql+psycopg2://postgres@127.0.0.1:1/ett"  # nothing listens there
    env = {"AIRFLOW__ETT__STORE_URL": dead_store, "AIRFLOW__ETT__EMIT_TIMEOUT": "1.0",
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins)}
    with EmbeddedAirflow(home, dags, extra_env=env) as af:
        migrate(af, ett_store=False)  # the store is down: its upgrade would fail
        af.start(WITHOUT_TRIGGERER)
        af.wait_until_ready(180.0)
        af.wait_for_dag("ett_tiny", timeout=120.0)
        af.unpause("ett_tiny")
        run_id = af.trigger("ett_tiny")
        assert af.wait_for_run("ett_tiny", run_id, timeout=300.0) == "success"
        task_log = af.task_log_path("ett_tiny", run_id, "hello", 1).read_text()
    assert "injected listener fault" in task_log  # the hook did raise, and was contained

    spool = home / "ett_spool"
    assert any(spool.iterdir()), "nothing was spooled while the store was down"
    good = f"sqlite:///{tmp_path}/ett.db"
    cli = str(venv_script("airflow-ett"))
    for args in (["db", "upgrade"], ["spool", "replay", "--spool-dir", str(spool)]):
        done = subprocess.run([cli, *args, "--store-url", good], capture_output=True,
                              text=True, timeout=120, check=False, env={**af.env})
        assert done.returncode == 0, done.stderr
    with EttStore(good) as store:
        events = store.job_events(job_id_for("ett_tiny", run_id))
    assert [(e.tenant, e.dag_id) for e in events if isinstance(e, JobSubmitted)] == [
        ("t", "ett_tiny")]
    states = [(e.task_id, e.state) for e in events if isinstance(e, TaskStateChanged)]
    assert states == [("hello", "running")]  # success was the injected fault's victim
    # A second replay finds nothing left: every event was delivered once.
    again = subprocess.run([cli, "spool", "replay", "--spool-dir", str(spool), "--store-url",
                            good], capture_output=True, text=True, timeout=120, check=False,
                           env={**af.env})
    assert "replayed 0 event(s)" in again.stdout
