"""The distributed test runs what is deployed: the harness's environment and commands are
docker/compose.yaml's and docker/airflow.env's, changed only where this host must differ
(hosts, the image's paths, the two workers' log ports and node names, the test's timings).
No service is started here."""

from __future__ import annotations

from pathlib import Path

from tests.distributed.cluster import CeleryAirflow, Services, pg_url
from tests.distributed.topology import airflow_components, load_topology, path_settings

HOSTS = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL",
         "AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__ETT__STORE_URL"}


def _cluster(tmp_path: Path, extra: dict[str, str] | None = None) -> CeleryAirflow:
    return CeleryAirflow(tmp_path / "home", tmp_path / "dags", Services("a_db", "e_db", 7),
                         extra)


def test_every_deployed_setting_reaches_the_processes_unchanged_but_hosts_and_paths(
        tmp_path: Path) -> None:
    topology = load_topology()
    extra = {"AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20"}
    af = _cluster(tmp_path, extra)
    paths = path_settings(topology)
    changed = {k for k, v in topology.settings.items() if af.env.get(k) != v}
    assert changed <= set(paths) | set(extra), changed - set(paths) - set(extra)
    for key, image_path in paths.items():  # each image path has a local twin
        assert af.env[key] == str(tmp_path / image_path.lstrip("/"))
    assert af.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert af.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == pg_url("a_db")
    assert af.env["AIRFLOW__ETT__STORE_URL"] == pg_url("e_db")
    assert af.env["AIRFLOW__CELERY__BROKER_URL"].endswith("/7")
    assert set(af.env) >= HOSTS


def test_the_harness_starts_the_deployments_services_with_their_own_commands(
        tmp_path: Path) -> None:
    topology = load_topology()
    af = _cluster(tmp_path)
    deployed = airflow_components(topology)
    assert set(af.commands) == set(deployed)
    for name, args in af.commands.items():
        if name in af.workers:  # one host: each worker its node name and log port
            assert args == (*deployed[name], "--celery-hostname", f"{name}@%h")
            assert set(af.env_of[name]) == {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"}
        else:
            assert args == deployed[name]
    ports = {env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] for env in af.env_of.values()}
    assert len(ports) == len(af.workers) == 2
    assert {q for w in topology.workers for q in w.queues} == {"gpu", "cpu"}


def test_a_scaled_worker_service_runs_more_processes_of_the_same_command(
        tmp_path: Path) -> None:
    af = CeleryAirflow(tmp_path / "home", tmp_path / "dags", Services("a", "e", 7),
                       scale={"worker-gpu": 2})
    assert sorted(af.workers) == ["worker-cpu", "worker-gpu", "worker-gpu-2"]
    assert af.workers["worker-gpu-2"] == af.workers["worker-gpu"]
    assert af.commands["worker-gpu-2"][:-1] == af.commands["worker-gpu"][:-1]
    assert af.commands["worker-gpu-2"][-1] == "worker-gpu-2@%h"
    ports = {env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] for env in af.env_of.values()}
    assert len(ports) == 3
    for bad in ({"scheduler": 2}, {"worker-cpu": 0}):
        try:
            CeleryAirflow(tmp_path / "h2", tmp_path / "dags", Services("a", "e", 7), scale=bad)
        except ValueError as exc:
            assert str(next(iter(bad))) in str(exc)
        else:
            raise AssertionError(f"scale={bad} was accepted")
