"""The deployment (docker/) without a container engine: the compose file as a real compose
implementation reads it, checked against the code it deploys.

No engine runs on these machines, so nothing here starts a container. What is checked:
- `docker-compose config` (Debian's docker-compose, a real implementation) accepts the
  file with the secrets set and refuses it, naming the secret, without each one: secrets
  are required, never defaulted;
- the services, queues and settings it names are the ones the code and the distributed
  test use: the workers' queues are the operators' default queues, every key of
  docker/airflow.env is an option Airflow or the [ett] provider section declares (a typo
  fails here instead of silently doing nothing), every Airflow service receives those
  settings unchanged and sets none of them itself, every Airflow command (services and
  health checks) parses with Airflow's own CLI parser;
- the GPU worker asks for an NVIDIA device and nothing else does; every long-running
  service has a health check; the work volume is where AIRFLOW__ETT__WORK_DIR says on
  every process that needs it; the Dockerfile bakes in no secret and runs as non-root;
- the PostgreSQL init script creates its databases on a real server, idempotently;
- tests/distributed/topology.py (the one reader of the file for tests) refuses malformed
  files by field and value.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.distributed.topology import (
    AIRFLOW_ENV_PATH,
    COMPOSE_PATH,
    REPO,
    Topology,
    TopologyError,
    airflow_components,
    load_topology,
    parse_env_file,
    path_settings,
)

DOCKERFILE = REPO / "docker" / "Dockerfile"
INIT_SCRIPT = REPO / "docker" / "postgres-init" / "10-databases.sh"
INSTALL = "apt-get install docker-compose (Debian's package; scripts/test.sh installs it as root)"

#: Every secret the compose file needs from the environment, each with no default.
SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret-1",
    "REDIS_PASSWORD": "redis-secret-2",
    "AIRFLOW_JWT_SECRET": "jwt-secret-3",
    "AIRFLOW_API_SECRET_KEY": "api-secret-4",
    "AIRFLOW_FERNET_KEY": "fernet-secret-5",
    "FLOWER_BASIC_AUTH": "admin:flower-secret-6",
}
EXPECTED_SERVICES = {
    "postgres", "redis", "airflow-init", "api-server", "scheduler", "dag-processor",
    "triggerer", "worker-gpu", "worker-cpu", "flower", "preemption-controller",
}
ONE_SHOT = {"airflow-init"}
#: The image's AIRFLOW_HOME (Dockerfile ENV); the [ett] defaults are relative to it.
IMAGE_HOME = "/opt/airflow"


# --- docker-compose, the real implementation --------------------------------------------


def _compose(args: list[str], env: Mapping[str, str],
             tmp_path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(f"docker-compose is not installed: {INSTALL}")
    # An empty --env-file: an operator's docker/.env must not fill in what a test leaves out.
    empty = tmp_path / "empty.env"
    empty.write_text("", encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if k not in SECRETS and not k.startswith("ETT_")}
    return subprocess.run(
        [exe, "--env-file", str(empty), "-f", str(COMPOSE_PATH), *args],
        env={**base, **env}, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`docker-compose config`'s resolved model (env_file merged, anchors and variables
    resolved), parsed."""
    done = _compose(["config"], SECRETS, tmp_path_factory.mktemp("compose"))
    assert done.returncode == 0, f"docker-compose config failed:\n{done.stderr}"
    loaded = yaml.safe_load(done.stdout)
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def topology() -> Topology:
    return load_topology()


@pytest.mark.integration
def test_a_real_compose_implementation_accepts_the_file(tmp_path: Path) -> None:
    done = _compose(["config", "-q"], SECRETS, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


@pytest.mark.integration
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_every_secret_is_required_and_named_when_missing(missing: str, tmp_path: Path) -> None:
    unset = {k: v for k, v in SECRETS.items() if k != missing}
    done = _compose(["config", "-q"], unset, tmp_path)
    assert done.returncode != 0, f"compose accepted the file without {missing}"
    assert missing in done.stderr, done.stderr
    # `:?` refuses an empty value too: an empty secret is no secret
    done = _compose(["config", "-q"], {**unset, missing: ""}, tmp_path)
    assert done.returncode != 0 and missing in done.stderr, done.stderr


@pytest.mark.integration
def test_the_resolved_file_has_exactly_the_expected_services(config: dict[str, Any],
                                                             topology: Topology) -> None:
    assert set(config["services"]) == EXPECTED_SERVICES
    assert set(topology.services) == EXPECTED_SERVICES  # our reader sees what compose sees


def _airflow_services(config: Mapping[str, Any], topology: Topology) -> list[str]:
    """The services that run the project's image (everything but postgres and redis)."""
    image = config["services"]["api-server"]["image"]
    names = [n for n, s in config["services"].items()
             if s.get("image") == image or "build" in s]
    assert {"postgres", "redis"}.isdisjoint(names)
    return names


@pytest.mark.integration
def test_every_airflow_service_gets_the_settings_file_unchanged(config: dict[str, Any],
                                                                topology: Topology) -> None:
    """compose merges airflow.env into each service: the values it resolved are exactly the
    ones topology.py read (so the distributed test runs with what is deployed), and no
    service sets a key of the file itself (an override would drift unseen)."""
    names = _airflow_services(config, topology)
    assert len(names) == len(EXPECTED_SERVICES) - 2
    assert topology.settings, "airflow.env holds no settings"
    for name in names:
        env = config["services"][name]["environment"]
        resolved = {k: str(env.get(k)) for k in topology.settings}
        assert resolved == dict(topology.settings), name
        own = set(topology.services[name].environment)
        assert own.isdisjoint(topology.settings), (name, own & set(topology.settings))


@pytest.mark.integration
def test_hosts_and_secrets_come_from_the_environment(config: dict[str, Any],
                                                     topology: Topology) -> None:
    for name in _airflow_services(config, topology):
        env = config["services"][name]["environment"]
        # one JWT secret, one Fernet key for every component
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == SECRETS["AIRFLOW_JWT_SECRET"], name
        assert env["AIRFLOW__CORE__FERNET_KEY"] == SECRETS["AIRFLOW_FERNET_KEY"], name
        pg = SECRETS["POSTGRES_PASSWORD"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == (
            f"postgresql+psycopg2://airflow:{pg}@postgres:5432/airflow"), name
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == (
            f"db+postgresql+psycopg2://airflow:{pg}@postgres:5432/airflow"), name
        # the ETT store: its own database on the same server
        assert env["AIRFLOW__ETT__STORE_URL"] == (
            f"postgresql+psycopg2://airflow:{pg}@postgres:5432/ett"), name
        assert env["AIRFLOW__CELERY__BROKER_URL"] == (
            f"redis://:{SECRETS['REDIS_PASSWORD']}@redis:6379/0"), name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://api-server:8080/execution/"
    assert config["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == pg


# --- queues: the workers serve exactly what the operators send ---------------------------


def _operator_queues() -> dict[str, str]:
    """Where each of the project's tasks goes unless a DAG says otherwise."""
    from airflow_ett.operators.lifecycle import DEFAULT_QUEUES
    from airflow_ett.operators.prewarm import CompileCachePrewarmOperator
    from airflow_ett.operators.publish import PublishModelOperator
    from airflow_ett.operators.rollup import CPU_QUEUE
    from airflow_ett.operators.train import CommandTrainOperator, TorchRecTrainOperator
    from airflow_ett.scheduling import tenants

    def default(cls: type) -> str:
        """The `queue` default of the first class up the MRO whose __init__ takes one."""
        for klass in cls.__mro__:
            parameters = inspect.signature(klass.__init__).parameters  # type: ignore[misc]
            if "queue" in parameters:
                value = parameters["queue"].default
                assert isinstance(value, str), klass
                return value
        raise AssertionError(f"{cls.__name__} takes no queue")

    return {
        **{f"lifecycle {role}": queue for role, queue in DEFAULT_QUEUES.items()},
        "CompileCachePrewarmOperator": default(CompileCachePrewarmOperator),
        "TorchRecTrainOperator": default(TorchRecTrainOperator),
        "CommandTrainOperator": default(CommandTrainOperator),
        "PublishModelOperator": default(PublishModelOperator),
        "nightly rollup": CPU_QUEUE,
        "tenants file default_queue": tenants.DEFAULT_QUEUE,
        "tenants file cpu_queue": tenants.DEFAULT_CPU_QUEUE,
    }


def test_the_workers_serve_exactly_the_operators_queues(topology: Topology) -> None:
    queues = _operator_queues()
    assert queues["lifecycle train"] == queues["TorchRecTrainOperator"] == "gpu"
    assert queues["CommandTrainOperator"] == "gpu"
    served: dict[str, list[str]] = {}
    for worker in topology.workers:
        for queue in worker.queues:
            served.setdefault(queue, []).append(worker.service)
    assert set(served) == set(queues.values()), (served, queues)
    assert all(len(names) == 1 for names in served.values()), served
    # what nobody routes goes to a queue a worker serves
    assert topology.settings["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] in served


def test_only_the_training_worker_has_a_gpu(topology: Topology) -> None:
    train_queue = _operator_queues()["lifecycle train"]
    gpu_workers = {w.service for w in topology.workers if train_queue in w.queues}
    assert gpu_workers == {"worker-gpu"}
    assert {n for n, s in topology.services.items() if s.image_uses_gpu} == gpu_workers
    (gpu,) = [w for w in topology.workers if w.service == "worker-gpu"]
    assert gpu.concurrency == 1  # one training job per GPU host unless an operator says so


@pytest.mark.integration
def test_the_gpu_request_is_what_compose_resolves(config: dict[str, Any]) -> None:
    def devices(name: str) -> list[dict[str, Any]]:
        deploy = config["services"][name].get("deploy") or {}
        return ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []

    (device,) = devices("worker-gpu")
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert all(devices(n) == [] for n in config["services"] if n != "worker-gpu")


def test_the_local_components_are_the_airflow_services(topology: Topology) -> None:
    assert airflow_components(topology) == {
        "api-server": ("api-server",),
        "scheduler": ("scheduler",),
        "dag-processor": ("dag-processor",),
        "triggerer": ("triggerer",),
        "worker-gpu": ("celery", "worker", "--queues", "gpu", "--concurrency", "1"),
        "worker-cpu": ("celery", "worker", "--queues", "cpu"),
    }


# --- settings: every key is a real option -------------------------------------------------

#: [celery_broker_transport_options] is a free-form section: Airflow passes it to Kombu
#: whole (airflow.providers.celery.executors.default_celery), so it declares no options.
#: These are the Redis transport's own (kombu.transport.redis.Transport).
_FREE_FORM = {"celery_broker_transport_options": {
    "visibility_timeout", "sentinel_kwargs", "master_name", "global_keyprefix",
    "priority_steps", "sep", "queue_order_strategy", "socket_timeout",
    "socket_connect_timeout", "health_check_interval", "retry_on_timeout",
}}


def unknown_settings(keys: list[str]) -> list[str]:
    """The keys that Airflow would ignore: not AIRFLOW__<SECTION>__<KEY>, or an option no
    section declares ([ett] from the provider's metadata, which Airflow reads)."""
    from airflow.configuration import conf

    from airflow_ett.provider import get_provider_info

    ett = get_provider_info()["config"]["ett"]["options"]
    bad = []
    for name in keys:
        parts = name.split("__")
        if len(parts) != 3 or parts[0] != "AIRFLOW" or not all(parts):
            bad.append(f"{name} (not AIRFLOW__<SECTION>__<KEY>)")
            continue
        section, key = parts[1].lower(), parts[2].lower()
        known = (key in ett if section == "ett"
                 else key in _FREE_FORM[section] if section in _FREE_FORM
                 else conf.has_option(section, key, lookup_from_deprecated=False))
        if not known:
            bad.append(f"{name} ([{section}] {key} is no option)")
    return bad


def test_every_setting_is_an_option_airflow_reads(topology: Topology) -> None:
    assert unknown_settings(list(topology.settings)) == []


def test_the_option_check_catches_a_typo() -> None:
    assert unknown_settings(["AIRFLOW__CORE__EXECUTER", "AIRFLOW__ETT__WORKDIR",
                             "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY",
                             "AIRFLOW_CORE_EXECUTOR", "AIRFLOW__CORE__EXECUTOR"]) == [
        "AIRFLOW__CORE__EXECUTER ([core] executer is no option)",
        "AIRFLOW__ETT__WORKDIR ([ett] workdir is no option)",
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY "
        "([celery_broker_transport_options] visibility is no option)",
        "AIRFLOW_CORE_EXECUTOR (not AIRFLOW__<SECTION>__<KEY>)",
    ]


def test_the_deployment_settings_that_matter(topology: Topology) -> None:
    s = topology.settings
    assert s["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert s["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert 1 <= int(s["AIRFLOW__CELERY__WORKER_CONCURRENCY"]) <= 4
    # no host and no secret in the shared file: those are compose's `environment:`
    for key, value in s.items():
        assert not re.search(r"SECRET|PASSWORD|FERNET|_CONN$|_URL$", key), key
        assert "://" not in value and "@" not in value, (key, value)


def test_airflow_env_reads_the_same_with_python_dotenv() -> None:
    from dotenv import dotenv_values

    assert dotenv_values(AIRFLOW_ENV_PATH) == parse_env_file(AIRFLOW_ENV_PATH)


# --- commands and health checks -----------------------------------------------------------


def _words(test: list[str] | str) -> list[str]:
    if isinstance(test, str):
        return shlex.split(test)
    return shlex.split(test[1]) if test[0] == "CMD-SHELL" else list(test[1:])


@pytest.mark.integration
def test_every_long_running_service_has_a_health_check(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        if name in ONE_SHOT:
            assert service["restart"] == "no", name
            continue
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name}: no health check"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert service.get("restart") == "unless-stopped", name


@pytest.mark.integration
def test_every_service_waits_for_what_it_needs(config: dict[str, Any],
                                               topology: Topology) -> None:
    for name in _airflow_services(config, topology):
        needs = config["services"][name]["depends_on"]
        assert needs["postgres"]["condition"] == "service_healthy", name
        if name not in ONE_SHOT:
            assert needs["redis"]["condition"] == "service_healthy", name
            assert needs["airflow-init"]["condition"] == "service_completed_successfully", name


def _airflow_commands(config: Mapping[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """Every `airflow ...` and `airflow-ett ...` command the file runs: service commands,
    health checks, and the one-shot's shell line (split at &&)."""
    for name, service in config["services"].items():
        lines: list[list[str]] = []
        command = service.get("command") or []
        if command[:2] == ["bash", "-c"]:
            lines += [shlex.split(part) for part in command[2].split("&&")]
        else:
            lines.append(list(command))
        if "healthcheck" in service:
            lines.append(_words(service["healthcheck"]["test"]))
        for words in lines:
            if words and words[0] in ("airflow", "airflow-ett"):
                yield name, words


@pytest.mark.integration
def test_every_airflow_command_parses_with_the_real_cli(config: dict[str, Any]) -> None:
    """Airflow's and airflow-ett's own argparse parsers accept each command (a misspelt
    subcommand, option or --job-type choice makes argparse exit)."""
    from airflow.cli.cli_parser import get_parser

    from airflow_ett.cli import build_parser

    parsers = {"airflow": get_parser(), "airflow-ett": build_parser()}
    seen = set()
    for name, words in _airflow_commands(config):
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # argparse prints its usage
                parsers[words[0]].parse_args(words[1:])
        except SystemExit as exc:
            pytest.fail(f"{name}: {shlex.join(words)} is refused by its CLI (exit {exc.code})")
        seen.add(shlex.join(words[:3]))
    assert {"airflow db migrate", "airflow-ett db upgrade", "airflow jobs check",
            "airflow celery worker", "airflow celery flower",
            "airflow-ett preemption run"} <= seen


@pytest.mark.integration
def test_the_health_checks_probe_what_this_airflow_serves(config: dict[str, Any]) -> None:
    """The celery app the worker checks ping, and the api-server's health route, exist in
    the installed versions."""
    import importlib

    from airflow.api_fastapi.core_api.routes.public.monitor import monitor_router

    for name in ("worker-gpu", "worker-cpu"):
        words = _words(config["services"][name]["healthcheck"]["test"])
        assert words[:2] == ["celery", "--app"] and "ping" in words, words
        module, _, attr = words[2].rpartition(".")
        assert hasattr(importlib.import_module(module), attr), words[2]
        assert words[-2:] == ["-d", "celery@$${HOSTNAME}"], words  # `$$`: compose's escape
    url = _words(config["services"]["api-server"]["healthcheck"]["test"])[-1]
    assert url == "http://localhost:8080/api/v2/monitor/health"
    assert any(getattr(r, "path", "") == "/monitor/health" for r in monitor_router.routes)


# --- volumes ------------------------------------------------------------------------------


def _mounts(service: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read_only), from compose's short or long volume syntax."""
    out = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            parts = volume.split(":")
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
        else:
            source, target = volume.get("source", ""), volume["target"]
            read_only = bool(volume.get("read_only"))
        out[target] = (source, read_only)
    return out


@pytest.mark.integration
def test_the_work_volume_is_where_work_dir_says_on_every_process_that_needs_it(
        config: dict[str, Any], topology: Topology) -> None:
    work_dir = topology.settings["AIRFLOW__ETT__WORK_DIR"]
    needs_it = {w.service for w in topology.workers} | {"preemption-controller"}
    for name in needs_it:
        assert _mounts(config["services"][name]).get(work_dir) == ("ett-work", False), name
    for name, service in config["services"].items():
        if name not in needs_it:
            assert work_dir not in _mounts(service), f"{name} needs no work_dir"
    assert "ett-work" in config["volumes"]
    # every other path setting lies on that volume (reports: whichever cpu worker ran the
    # rollup, every host reads the same files)
    for key, value in path_settings(topology).items():
        assert Path(value).is_relative_to(work_dir), (key, value)


@pytest.mark.integration
def test_every_airflow_service_mounts_dags_logs_and_spool(config: dict[str, Any],
                                                          topology: Topology) -> None:
    """At the AIRFLOW_HOME-relative defaults the settings leave in force (the image's
    AIRFLOW_HOME is /opt/airflow); the DAGs read-only."""
    from airflow_ett.provider import CONFIG_DEFAULTS

    assert f"AIRFLOW_HOME={IMAGE_HOME}" in _dockerfile_env_and_args()["ENV"]
    spool = CONFIG_DEFAULTS["spool_dir"].replace("{AIRFLOW_HOME}", IMAGE_HOME)
    for name in _airflow_services(config, topology):
        mounts = _mounts(config["services"][name])
        assert mounts[f"{IMAGE_HOME}/dags"][1] is True, name
        assert mounts[f"{IMAGE_HOME}/logs"] == ("airflow-logs", False), name
        assert mounts[spool] == ("ett-spool", False), name


# --- the Dockerfile -----------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.rstrip().endswith("\\"):
            continue
        if pending.strip():
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def _dockerfile_env_and_args() -> dict[str, list[str]]:
    """Each ENV and ARG assignment as NAME=VALUE (ENV's `A=1 B=2` form split)."""
    found: dict[str, list[str]] = {"ENV": [], "ARG": []}
    for word, rest in _instructions():
        if word in found:
            found[word] += shlex.split(rest)
    return found


def test_the_dockerfile_bakes_in_no_secret() -> None:
    secret = re.compile(r"SECRET|PASSW|TOKEN|FERNET|JWT|CREDENTIAL|API_?KEY|PRIVATE", re.I)
    found = _dockerfile_env_and_args()
    assert found["ENV"] and found["ARG"]
    for item in found["ENV"] + found["ARG"]:
        assert not secret.search(item), f"the Dockerfile bakes in {item!r}"
    assert "--mount=type=secret" not in DOCKERFILE.read_text(encoding="utf-8")


def test_the_image_runs_as_a_non_root_user_from_the_pinned_base() -> None:
    steps = _instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE}"]
    assert "PYTHON_IMAGE=python:3.11-slim-bookworm" in _dockerfile_env_and_args()["ARG"]
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), users
    # installs as scripts/setup.sh does: constraints, then torchrec without its deps
    run = " ".join(rest for word, rest in steps if word == "RUN")
    assert '-c "$constraints" --extra-index-url "$index" .' in run
    assert '--no-deps "torchrec==$TORCHREC_VERSION"' in run


def test_secrets_and_local_state_stay_out_of_the_build_context() -> None:
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    for pattern in ("**/.env", ".venv", ".git", "**/*.db"):
        assert pattern in ignored, pattern


# --- the PostgreSQL init script, against a real server ------------------------------------


@pytest.mark.integration
@pytest.mark.postgres
def test_the_init_script_creates_both_databases_idempotently() -> None:
    import secrets

    psycopg2 = pytest.importorskip("psycopg2")
    if shutil.which("psql") is None:
        pytest.fail("psql is not installed (apt-get install postgresql-client)")
    dsn = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5"
    try:
        admin = psycopg2.connect(dsn)
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable ({dsn}): {str(exc).strip()}")
    admin.autocommit = True
    names = [f"ett_init_{secrets.token_hex(4)}_{role}" for role in ("airflow", "ett")]
    env = {**os.environ, "POSTGRES_USER": "postgres", "PGHOST": "127.0.0.1",
           "PGPORT": "5432", "ETT_INIT_DATABASES": " ".join(names)}
    try:
        for _ in range(2):  # the second run finds both and changes nothing
            done = subprocess.run(["bash", str(INIT_SCRIPT)], env=env, capture_output=True,
                                  text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
        with admin.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,))
            assert sorted(r[0] for r in cur.fetchall()) == sorted(names)
    finally:
        with admin.cursor() as cur:
            for name in names:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()
    assert "airflow ett" in INIT_SCRIPT.read_text(encoding="utf-8")  # the deployed default


# --- topology.py refuses malformed files by field and value -------------------------------

_GOOD_SERVICE = {"command": ["airflow", "celery", "worker", "--queues", "cpu"],
                 "env_file": "a.env"}


def _write(tmp_path: Path, services: object, env: str = "A=1\n") -> Path:
    (tmp_path / "a.env").write_text(env, encoding="utf-8")
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump({"services": services}), encoding="utf-8")
    return path


def test_topology_reads_a_minimal_file(tmp_path: Path) -> None:
    topo = load_topology(_write(tmp_path, {"w": {**_GOOD_SERVICE, "command": [
        "airflow", "celery", "worker", "-q", "a,b", "-c", "3"]}}))
    assert topo.workers[0].queues == ("a", "b") and topo.workers[0].concurrency == 3
    assert dict(topo.settings) == {"A": "1"}


@pytest.mark.parametrize(("services", "message"), [
    ([], "services = []: must be a non-empty mapping"),
    ({"w": {**_GOOD_SERVICE, "command": "airflow scheduler"}},
     "service 'w': command = 'airflow scheduler': must be a YAML list of strings"),
    ({"w": {**_GOOD_SERVICE, "command": ["airflow", "celery", "worker"]}},
     "service 'w': command --queues = None: a worker must name its queues"),
    ({"w": {**_GOOD_SERVICE, "command": ["airflow", "celery", "worker", "--queues", "a,"]}},
     "service 'w': command --queues = 'a,': a worker must name its queues"),
    ({"w": {**_GOOD_SERVICE, "command": [*_GOOD_SERVICE["command"], "--concurrency", "x"]}},
     "service 'w': command --concurrency = 'x': must be an integer"),
    ({"w": {**_GOOD_SERVICE, "environment": {"FLAG": True}}},
     "service 'w': environment[FLAG] = True: must be a string"),
    ({"w": {**_GOOD_SERVICE, "environment": ["NOVALUE"]}},
     "service 'w': environment entry = 'NOVALUE': must be KEY=VALUE"),
    ({"w": {**_GOOD_SERVICE, "deploy": {"resources": {"reservations": {"devices": "gpu"}}}}},
     "service 'w': deploy.resources.reservations.devices = 'gpu': must be a list"),
    ({"w": {"command": ["airflow", "scheduler"]}}, "env_file = {}: the Airflow services"),
    ({"w": _GOOD_SERVICE, "v": {**_GOOD_SERVICE, "env_file": "b.env"}},
     "the Airflow services must share exactly one settings file"),
])
def test_topology_names_field_and_value_of_a_malformed_file(
        tmp_path: Path, services: object, message: str) -> None:
    with pytest.raises(TopologyError) as caught:
        load_topology(_write(tmp_path, services))
    assert message in str(caught.value)


def test_topology_refuses_a_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text("- a\n", encoding="utf-8")
    with pytest.raises(TopologyError, match=r"document = 'list': must be a mapping"):
        load_topology(path)
    path.write_text("services: [\n", encoding="utf-8")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(path)
    with pytest.raises(TopologyError, match="cannot read it"):
        load_topology(tmp_path / "absent.yaml")


@pytest.mark.parametrize(("line", "message"), [
    ("A='1'", "A = \"'1'\": write the value without quotes"),
    ("export A=1", "key = 'export A': must be a bare variable name"),
    ("A = 1", "key = 'A ': must be a bare variable name"),
    ("A=1 # one", "A = '1 # one': no inline comments"),
    ("A=1 ", "A = '1 ': leading or trailing whitespace"),
    ("A", "line = 'A': expected KEY=VALUE"),
    ("A=1\nA=2", "A = '2': set twice (first: '1')"),
])
def test_the_settings_file_is_read_strictly(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "a.env"
    path.write_text(f"# a comment\n\n{line}\n", encoding="utf-8")
    with pytest.raises(TopologyError) as caught:
        parse_env_file(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
