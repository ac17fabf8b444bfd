"""A running job's rolling-window gauges from a real train task's process, received as
StatsD lines on a real UDP socket (decision 0030: the task process sends them).

A real scheduler, dag processor and API server (EmbeddedAirflow) with plain StatsD pointed
at a socket this test listens on and `[ett] rolling_metrics_interval_s` at its least (10
s); a recorded DAG whose one task is a train task (`ett_role = "train"`) that runs for 14
s. While it runs, its process must send the windows' gauges through the Task SDK's
`Stats`, with the DAG, tenant and model in the names and the job's 4 GPUs in the GPU
time; when it ends, the time gauges must go to 0.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER
from tests.e2e.test_metrics_statsd import PREFIX, StatsdServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

DAG = '''
import time
from pathlib import Path

from airflow.sdk import DAG, BaseOperator


class Train(BaseOperator):
    ett_role = "train"  # what the listener looks for: the lifecycle's train operators say so

    def execute(self, context):
        # runs until the test has seen a gauge sent while it ran (not for a fixed time:
        # a loaded machine may tick later), at most 5 minutes
        deadline = time.monotonic() + 300
        while not Path(RELEASE).exists() and time.monotonic() < deadline:
            time.sleep(0.2)


with DAG("ett_rolling", schedule=None,
         tags=["ett", "ett:tenant=t", "ett:model=none", "ett:gpus=4"]):
    Train(task_id="train")
'''


def test_a_train_task_s_process_sends_its_rolling_windows(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    release = tmp_path / "release"
    (dags / "ett_rolling.py").write_text(textwrap.dedent(DAG).replace(
        "RELEASE", repr(str(release))))
    server = StatsdServer()
    env = {"AIRFLOW__METRICS__STATSD_ON": "True",
           "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(server.port),
           "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
           "AIRFLOW__ETT__STORE_URL": f"sqlite:///{tmp_path}/ett.db",
           "AIRFLOW__ETT__ROLLING_WINDOWS": "5,60",
           "AIRFLOW__ETT__ROLLING_METRICS_INTERVAL_S": "10"}
    try:
        with EmbeddedAirflow(tmp_path / "home", dags, extra_env=env) as af:
            migrate(af)
            af.start(WITHOUT_TRIGGERER)
            af.wait_until_ready(180.0)
            af.wait_for_dag("ett_rolling", timeout=120.0)
            af.unpause("ett_rolling")
            run_id = af.trigger("ett_rolling")
            server.wait_for("ett.window.5m.e2e_s.t.none.ett_rolling", timeout=240.0)
            release.touch()  # a gauge came while the task ran: let it end
            assert af.wait_for_run("ett_rolling", run_id, timeout=300.0) == "success"
            # the scheduler's finished-job metrics come after the task's last gauges
            server.wait_for("ett.job.finished.t.none.ett_rolling", timeout=60.0)
            time.sleep(0.5)
    finally:
        server.close()

    dims = ".t.none.ett_rolling"
    lines = server.ours()

    def values(name: str) -> list[float]:
        return [float(v) for n, v, k in lines if n == name and k == "g"]

    for suffix in (dims, ""):
        e2e = values(f"ett.window.5m.e2e_s{suffix}")
        # a send while the task ran (every 10 s), then the 0 at its end
        assert len(e2e) >= 2 and e2e[-1] == 0.0 and all(v > 0 for v in e2e[:-1]), e2e
        gpu = values(f"ett.window.60m.gpu_e2e_s{suffix}")
        assert gpu[:-1] == [pytest.approx(4 * v) for v in e2e[:-1]] and gpu[-1] == 0.0
        # the task reports no training: all of the job's time so far is scheduling
        assert set(values(f"ett.window.5m.ett_pct{suffix}")) == {0.0}
        assert set(values(f"ett.window.60m.scheduling_pct{suffix}")) == {100.0}  # exactly
