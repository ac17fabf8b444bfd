"""A job past its tenant's time-to-start bound is flagged while it still waits, on a real
Airflow (dag-processor, scheduler, triggerer, API server; SQLite, LocalExecutor).

The tenant `late` has `max_tts_s = 5`; its command job's train task goes to the tenant's
pool (the cluster policy), which nobody created (`airflow-ett tenants sync` was not run),
so the task waits in the scheduler for good. The deadline the policy put on the DAG is
missed 5 s after the run was queued; the triggerer runs our callback, which finds no
effective step in the ETT store and flags the job. Checked while the run still waits,
on the store and on the run's JSON API (what its page shows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore
from tests.airflow_db import migrate

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

TENANTS = """
[tenants.late]
priority = 1
quota_gpus = 1
max_tts_s = 5
"""

DAG = '''
from airflow_ett.operators import training_job

dag = training_job("tts_late", command=["true"], model="own", tenant="late",
                   is_paused_upon_creation=False)
'''


def _train_state(af: EmbeddedAirflow, run_id: str) -> str | None:
    body = af.api("GET", f"/api/v2/dags/tts_late/dagRuns/{quote(run_id, safe='')}"
                         "/taskInstances")
    states = {ti["task_id"]: ti["state"] for ti in body["task_instances"]}
    return states.get("train")


def test_a_job_waiting_past_its_bound_is_flagged_while_it_waits(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "late.py").write_text(DAG, encoding="utf-8")
    (tmp_path / "tenants.toml").write_text(TENANTS, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    env = {"AIRFLOW__ETT__TENANTS_FILE": str(tmp_path / "tenants.toml"),
           "AIRFLOW__ETT__STORE_URL": url}
    with EmbeddedAirflow(tmp_path / "home", dags, extra_env=env) as af:
        migrate(af)
        af.start()  # the triggerer runs the deadline's callback
        af.wait_until_ready(180.0)
        af.wait_for_dag("tts_late", timeout=120.0)
        run_id = af.trigger("tts_late")
        job = job_id_for("tts_late", run_id)

        def flagged() -> list[Any]:
            with EttStore(url) as store:
                return store.flags.of_job(job)

        (flag,) = af.wait_until("the job is flagged", flagged, timeout=240.0, poll=1.0)
        assert _train_state(af, run_id) == "scheduled"  # still waiting for its pool
        assert (flag.kind, flag.tenant, flag.bound_s) == ("time_to_start", "late", 5.0)
        assert flag.waited_s >= 5.0
        assert "past tenant late's time-to-start bound of 0.1 min" in flag.message
        run = af.api("GET", f"/ett/api/v1/runs/tts_late/{quote(run_id, safe='')}")
        assert [f["message"] for f in run["flags"]] == [flag.message]
        state = af.api("GET", f"/api/v2/dags/tts_late/dagRuns/{quote(run_id, safe='')}")
        assert state["state"] in ("queued", "running")
