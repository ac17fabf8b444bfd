"""The tenants' aged priority strategy on a real Airflow (scheduler, dag-processor, API
server; SQLite, LocalExecutor): while a blocker holds the only slot of a one-slot pool (the
GPU), three runs wait for it; the scheduler then starts them in aged-priority order, not in
arrival or priority order alone.

Tenants: `low` (priority 1) and `high` (priority 5), aging 1 point per hour. The runs
arrive (their run ids say when: that is the arrival the strategy reads) as `low` ten hours
ago, `high` now and `low` now (triggered in the order high, new low, old low): `low`'s old
run has gained 10 points and goes first, then `high`, then `low`'s new run; neither
arrival order nor priority alone gives that. The weights Airflow stored are checked against
`aged_weight` too. The cluster policy that puts the strategy on lifecycle tasks is tested
through a DagBag in tests/plugin/test_policy.py; here the DAGs set it themselves, so the
test needs no trainer.

Why a pool and not `parallelism=1`: Airflow 3.3.2's LocalExecutor never counts what it
dispatched as running (apache/airflow PR #71914, open), so the scheduler queues every task
at once and the executor's worker takes them first come, first served; the weight orders
only tasks that wait in the scheduler, and that is what a pool's free slots decide (tenant
pools are how train tasks wait in production: decision 0014). With the default pool, CI
saw the three start in trigger order.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.scheduling.rules import aged_weight, arrival_of_run
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

TENANTS = """
[scheduling]
aging_per_hour = 1.0

[tenants.low]
priority = 1
quota_gpus = 1

[tenants.high]
priority = 5
quota_gpus = 1
"""

POOL = "prio_gpu"

DAGS = '''
import time
from pathlib import Path
from airflow.sdk import DAG
from airflow.providers.standard.operators.python import PythonOperator
from airflow_ett.plugin.priority import EttTenantPriority

def hold(seconds):
    time.sleep(seconds)

def hold_until_released(release_file, timeout):
    deadline = time.monotonic() + timeout
    while not Path(release_file).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release_file} never appeared")
        time.sleep(0.2)

with DAG("prio_blocker", schedule=None, is_paused_upon_creation=False):
    PythonOperator(task_id="hold", python_callable=hold_until_released,
                   op_args=[RELEASE_FILE, 600], pool=POOL)

for tenant, priority in (("low", 1), ("high", 5)):
    with DAG(f"prio_{tenant}", schedule=None, is_paused_upon_creation=False,
             tags=[f"ett:tenant={tenant}"]):
        PythonOperator(task_id="work", python_callable=hold, op_args=[1], pool=POOL,
                       priority_weight=priority, weight_rule=EttTenantPriority())
'''


def _run_id(when: dt.datetime) -> str:
    return f"manual__{when.isoformat()}"


def _trigger(af: EmbeddedAirflow, dag_id: str, run_id: str) -> None:
    af.api("POST", f"/api/v2/dags/{dag_id}/dagRuns",
           {"dag_run_id": run_id, "logical_date": None})


def _tis(af: EmbeddedAirflow, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    body = af.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
    return [dict(ti) for ti in body["task_instances"]]


def _the_ti(af: EmbeddedAirflow, dag_id: str, run_id: str) -> dict[str, Any]:
    (ti,) = _tis(af, dag_id, run_id)
    return ti


def _all_scheduled(af: EmbeddedAirflow, runs: list[tuple[str, str, int]]) -> bool:
    """Every run's one task exists and waits in the scheduler (not yet queued)."""
    states = [[ti["state"] for ti in _tis(af, dag_id, run_id)] for dag_id, run_id, _ in runs]
    return states == [["scheduled"]] * len(runs)


def test_queued_runs_start_in_aged_priority_order(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    release = tmp_path / "release-the-slot"
    dag_file = DAGS.replace("RELEASE_FILE", repr(str(release))).replace("POOL", repr(POOL))
    (dags / "prio.py").write_text(dag_file, encoding="utf-8")
    tenants_file = tmp_path / "tenants.toml"
    tenants_file.write_text(TENANTS, encoding="utf-8")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    runs = [("prio_low", _run_id(now - dt.timedelta(hours=10)), 1),
            ("prio_high", _run_id(now), 5),
            ("prio_low", _run_id(now + dt.timedelta(seconds=1)), 1)]
    env = {"AIRFLOW__ETT__TENANTS_FILE": str(tenants_file),
           "AIRFLOW__ETT__STORE_URL": f"sqlite:///{tmp_path / 'ett.db'}"}
    with EmbeddedAirflow(tmp_path / "home", dags, parallelism=2, extra_env=env) as af:
        migrate(af)
        af.start(WITHOUT_TRIGGERER)
        af.wait_until_ready(180.0)
        af.api("POST", "/api/v2/pools", {"name": POOL, "slots": 1}, expect=(200, 201))
        for dag_id in ("prio_blocker", "prio_low", "prio_high"):
            af.wait_for_dag(dag_id, timeout=120.0)
        blocker = af.trigger("prio_blocker")
        af.wait_until("the blocker runs",
                      lambda: _the_ti(af, "prio_blocker", blocker)["state"] == "running", 120.0)
        # Triggered newest-looking first: FIFO would start high, new low, old low, and
        # priority alone high first; aging says old low, high, new low.
        for dag_id, run_id, _ in (runs[1], runs[2], runs[0]):
            _trigger(af, dag_id, run_id)
        # The slot frees only once all three wait for it in the scheduler: a task not yet
        # created when the blocker ends would start first by being alone, not by weight.
        af.wait_until("all three runs wait for the slot",
                      lambda: _all_scheduled(af, runs), 300.0, poll=0.5)
        release.touch()
        for dag_id, run_id, _ in runs:
            assert af.wait_for_run(dag_id, run_id, timeout=300.0) == "success"
        assert af.wait_for_run("prio_blocker", blocker, timeout=120.0) == "success"
        tis = [_the_ti(af, dag_id, run_id) for dag_id, run_id, _ in runs]
        blocker_end = _the_ti(af, "prio_blocker", blocker)["end_date"]
    for ti, (_, run_id, priority) in zip(tis, runs, strict=True):
        assert ti["priority_weight"] == aged_weight(priority, arrival_of_run(run_id, 0), 1.0)
        assert ti["start_date"] >= blocker_end  # every one waited for the only slot
    starts = [ti["start_date"] for ti in tis]
    assert starts == sorted(starts), tis  # old low, then high, then new low
