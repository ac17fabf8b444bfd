"""ETT metrics from a real Airflow run, received as StatsD lines on a real UDP socket.

A real scheduler, dag processor and API server (EmbeddedAirflow) with
`[metrics] statsd_on` pointed at a socket this test listens on (a thread collecting
datagrams); a tiny recorded DAG is triggered, and once it has succeeded the run's job
metrics must arrive from the scheduler, under the names that carry the DAG, tenant and
model on plain StatsD (docs/metrics.md), with the values the ETT store gives for that job,
together with the emitter's counters.
"""

from __future__ import annotations

import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

PREFIX = "ettp"  # not Airflow's default: only this installation's lines are ours

DAG = '''
from airflow.sdk import DAG, task

with DAG("ett_tiny", schedule=None, tags=["ett", "ett:tenant=t", "ett:model=none"]):
    @task
    def hello() -> int:
        return 1

    hello()
'''


class StatsdServer:
    """A UDP socket on 127.0.0.1 and a thread that keeps every line it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statsd-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            with self._lock:
                self.lines.extend(data.decode(errors="replace").splitlines())

    def ours(self) -> list[tuple[str, str, str]]:
        """(name without the prefix, value, type) of each ETT line so far."""
        with self._lock:
            lines = list(self.lines)
        out = []
        for line in lines:
            if not line.startswith(f"{PREFIX}.ett."):
                continue
            name, rest = line.split(":", 1)
            value, kind = rest.split("|")[:2]
            out.append((name.removeprefix(f"{PREFIX}."), value, kind))
        return out

    def wait_for(self, name: str, timeout: float) -> list[tuple[str, str, str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(n == name for n, _, _ in self.ours()):
                return self.ours()
            time.sleep(0.2)
        raise AssertionError(f"no {name!r} line within {timeout} s; ETT lines: {self.ours()}"
                             f"; {len(self.lines)} lines in all")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.sock.close()


def test_a_finished_run_s_metrics_reach_a_statsd_server(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "ett_tiny.py").write_text(textwrap.dedent(DAG))
    store_url = f"sqlite:///{tmp_path}/ett.db"
    server = StatsdServer()
    env = {"AIRFLOW__METRICS__STATSD_ON": "True",
           "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(server.port),
           "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
           "AIRFLOW__ETT__STORE_URL": store_url}
    try:
        with EmbeddedAirflow(tmp_path / "home", dags, extra_env=env) as af:
            migrate(af)
            af.start(WITHOUT_TRIGGERER)
            af.wait_until_ready(180.0)
            af.wait_for_dag("ett_tiny", timeout=120.0)
            af.unpause("ett_tiny")
            run_id = af.trigger("ett_tiny")
            assert af.wait_for_run("ett_tiny", run_id, timeout=300.0) == "success"
            dims = ".t.none.ett_tiny"  # <tenant>.<model>.<dag_id>: plain StatsD has no tags
            server.wait_for(f"ett.job.finished{dims}", timeout=60.0)
            # The scheduler sends the emitter's counters right after the job's metrics.
            lines = server.wait_for("ett.emitter.sent", timeout=15.0)
    finally:
        server.close()

    with EttStore(store_url) as store:
        job = job_id_for("ett_tiny", run_id)
        summary = store.job_summary(job)
        stored_events = store.count_events(job)
    assert not summary.provisional and not summary.started  # no training: no TTS

    def values(name: str, kind: str) -> list[float]:
        return [float(v) for n, v, k in lines if n == name and k == kind]

    for suffix in (dims, ""):
        assert values(f"ett.job.finished{suffix}", "c") == [1.0]
        assert values(f"ett.job.ett_pct{suffix}", "g") == [pytest.approx(summary.ett_pct)]
        assert values(f"ett.job.e2e{suffix}", "ms") == [
            pytest.approx(summary.e2e_s * 1000.0, abs=0.01)]
        assert summary.e2e_s > 0
        assert values(f"ett.job.effective{suffix}", "ms") == [0.0]
        assert values(f"ett.job.gpu_e2e{suffix}", "ms") == [  # 1 GPU: GPU-ms = ms
            pytest.approx(summary.e2e_s * 1000.0, abs=0.01)]
        assert values(f"ett.job.csbt{suffix}", "ms") == [0.0]
        assert values(f"ett.job.nof.total{suffix}", "c") == [0.0]
        assert values(f"ett.job.tts{suffix}", "ms") == []
        assert values(f"ett.job.ttr{suffix}", "ms") == []
    # Events sent, counted where they were written: the scheduler (submission, end) and the
    # task process (the task's states, at its before_stopping). Each stored event once.
    sent = values("ett.emitter.sent", "c")
    assert sent and sum(sent) == stored_events >= 4, (sent, stored_events)
    assert values("ett.emitter.dropped", "c") == []
