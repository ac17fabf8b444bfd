"""A distributed Airflow on this machine, as the compose file describes it, without
containers: CeleryExecutor, this machine's PostgreSQL (a throwaway database each for
Airflow's metadata and the ETT store) and Redis (a database index of its own), and every
Airflow service of docker/compose.yaml as a process: api-server, scheduler,
dag-processor, triggerer, the `gpu` and the `cpu` Celery worker.

The settings come from the deployment itself (`tests/distributed/topology.py` reads
docker/compose.yaml and docker/airflow.env), so what is tested here is what is deployed.
What this harness changes is listed in `local_overrides`, each for a reason: hosts
(services are on 127.0.0.1, not on the compose network), paths (the home, DAGs and the
shared work directory are temporary directories), ports (two workers on one host each
need their own log server) and, where a test asks, timings (a lost worker is noticed
after seconds, not minutes).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ett.embedded import EmbeddedAirflow, free_port
from tests.distributed.topology import (
    Topology,
    Worker,
    airflow_components,
    load_topology,
    path_settings,
)

PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
#: Celery prints this once a worker consumes from its queues.
_WORKER_READY = re.compile(r"\S+@\S+ ready\.")


def pg_url(database: str, driver: str = "postgresql+psycopg2") -> str:
    return f"{driver}://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}"


@contextlib.contextmanager
def throwaway_databases(*roles: str) -> Iterator[dict[str, str]]:
    """A new PostgreSQL database per role (`airflow`, `ett`), dropped afterwards; yields
    role -> database name."""
    import psycopg2

    tag = secrets.token_hex(4)
    names = {role: f"ett_dist_{tag}_{role}" for role in roles}
    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for name in names.values():
                cur.execute(f'CREATE DATABASE "{name}"')
        yield names
    finally:
        with conn.cursor() as cur:
            for name in names.values():
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


@contextlib.contextmanager
def throwaway_redis_db() -> Iterator[int]:
    """An empty Redis database index (1..15) for the broker, emptied afterwards, so that
    another run's leftover messages cannot reach these workers."""
    import redis

    for index in range(15, 0, -1):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=index)
        # a key of our own claims the index against another run looking at the same time
        if client.dbsize() == 0 and client.set("ett-dist-claim", "1", nx=True):
            try:
                yield index
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    raise RuntimeError("no empty Redis database index in 1..15 for the broker")


@dataclass(frozen=True, slots=True)
class Services:
    airflow_db: str
    ett_db: str
    redis_db: int


def local_paths(topology: Topology, root: Path) -> dict[str, str]:
    """Each setting that is a path inside the image, under `root` on this host instead
    (`/opt/airflow/ett_work` -> `<root>/opt/airflow/ett_work`): what the image keeps
    together (reports under the work directory) stays together."""
    return {key: str(root / value.lstrip("/")) for key, value in path_settings(topology).items()}


def local_overrides(services: Services, paths: Mapping[str, str],
                    extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What this machine changes of the deployment's settings, and nothing else: hosts,
    the image's paths, and what a test adds (`extra`: timings)."""
    broker = f"redis://{REDIS_HOST}:{REDIS_PORT}/{services.redis_db}"
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg_url(services.airflow_db),
        "AIRFLOW__CELERY__BROKER_URL": broker,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + pg_url(services.airflow_db),
        "AIRFLOW__ETT__STORE_URL": pg_url(services.ett_db),
        **paths,
        **(extra or {}),
    }


def _scaled(workers: Mapping[str, Worker], scale: Mapping[str, int]) -> dict[str, Worker]:
    """`docker compose up --scale worker-gpu=2` on one host: more processes of a worker
    service, named `<service>-2`, `-3`, ..."""
    unknown = sorted(set(scale) - set(workers))
    if unknown:
        raise ValueError(f"scale: {unknown} are not worker services ({sorted(workers)})")
    out = dict(workers)
    for service, count in scale.items():
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"scale[{service!r}] = {count!r}: must be an integer >= 1")
        out.update({f"{service}-{i}": workers[service] for i in range(2, count + 1)})
    return out


class CeleryAirflow(EmbeddedAirflow):
    """`EmbeddedAirflow` with the deployment's services and settings (see the module)."""

    def __init__(self, home: Path, dags_folder: Path, services: Services,
                 overrides: Mapping[str, str] | None = None,
                 topology: Topology | None = None,
                 scale: Mapping[str, int] | None = None) -> None:
        self.topology = topology or load_topology()
        self.services = services
        paths = local_paths(self.topology, home.parent)
        #: the shared work directory (checkpoints, compile cache, models) of every worker
        self.work_dir = Path(paths["AIRFLOW__ETT__WORK_DIR"])
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.topology.settings, **local_overrides(services, paths, overrides)}
        super().__init__(home, dags_folder, extra_env=env)
        self.commands = airflow_components(self.topology)
        #: each worker process (`worker-gpu`, or `worker-gpu-2` when scaled) -> its service
        self.workers = _scaled({w.service: w for w in self.topology.workers}, scale or {})
        # Workers on one host: each its own log-server port and Celery node name.
        self.env_of = {name: {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
                       for name in self.workers}
        deployed = dict(self.commands)
        for name, worker in self.workers.items():
            args = deployed[worker.service]
            if "-H" not in args and "--celery-hostname" not in args:
                args = (*args, "--celery-hostname", f"{name}@%h")
            self.commands[name] = args

    @property
    def ett_url(self) -> str:
        return pg_url(self.services.ett_db)

    def start_all(self, workers: Any = None) -> None:
        """Every service, with the worker processes named (default: all of them)."""
        chosen = set(self.workers if workers is None else workers)
        self.start({name: args for name, args in self.commands.items()
                    if name not in self.workers or name in chosen}, env_of=self.env_of)

    def start_worker(self, name: str) -> None:
        self.start({name: self.commands[name]}, env_of=self.env_of)

    def wait_for_workers(self, names: Any = None, timeout: float = 120.0) -> None:
        """Until each Celery worker said it is ready (since its latest start); default:
        every worker started."""
        pending = [n for n in self.workers if n in self.pids] if names is None else list(names)
        deadline = time.monotonic() + timeout
        while pending:
            self.check_alive()
            pending = [n for n in pending if not _WORKER_READY.search(self.log_tail(n, 400))]
            if pending and time.monotonic() > deadline:
                tails = "\n".join(f"--- {n} ---\n{self.log_tail(n, 20)}" for n in pending)
                raise AssertionError(f"Celery workers not ready in {timeout:.0f} s: "
                                     f"{pending}\n{tails}")
            time.sleep(0.5)

    def worker_log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def workload_ran_on(self, dag_id: str, run_id: str, task_id: str) -> list[str]:
        """The workers whose log shows they received this task's workload (Celery's
        `Executing workload in Celery: ... task_id='...' ... run_id='...'`)."""
        found = []
        for name in self.workers:
            if not (self.log_dir / f"{name}.log").exists():
                continue
            for line in self.worker_log(name).splitlines():
                if ("Executing workload" in line and f"task_id='{task_id}'" in line
                        and f"dag_id='{dag_id}'" in line and f"run_id='{run_id}'" in line):
                    found.append(name)
                    break
        return found
