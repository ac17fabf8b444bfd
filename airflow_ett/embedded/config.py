"""What one embedded installation is made of: its executables, ports, secrets and the
environment every component reads its whole configuration from."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from airflow_ett._fs import atomic_write
from airflow_ett._untrusted import UntrustedFileError, load_json
from airflow_ett.embedded.errors import EmbeddedAirflowError

SECRETS_FILE = "embedded_secrets.json"


def venv_script(name: str) -> Path:
    """A console script (`airflow`, `airflow-ett`) of the interpreter running us.

    Not `shutil.which`: PATH may hold another Airflow (a system one, another venv), and the
    components must run the same Airflow, and see the same plugins, as this interpreter.
    `sys.executable` is not resolved: a venv's python is a symlink to the base interpreter,
    whose bin/ has neither script.
    """
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise EmbeddedAirflowError(f"no {name} executable next to {sys.executable}")
    return path


def airflow_executable() -> Path:
    return venv_script("airflow")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick; a small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def load_or_create_secrets(home: Path) -> dict[str, str]:
    """Secrets shared by every component, kept in `home` so that a restart agrees with them.

    The JWT secret signs the tokens the scheduler gives task runners for the Execution
    API: if the scheduler and the api-server disagree, every task fails to start. The
    Fernet key encrypts what one component stores for another (connections, variables,
    a trigger's kwargs: the scheduler writes a deadline callback's, the triggerer reads
    it). Left to Airflow, each process without a value in airflow.cfg would draw its own,
    or none, when the components start before any airflow.cfg exists.
    """
    path = home / SECRETS_FILE
    stored: dict[str, str] = {}
    if path.is_file():
        with contextlib.suppress(UntrustedFileError):  # three secrets: a few hundred bytes
            loaded = load_json(path, what="secrets file", max_bytes=1 << 20)
            if isinstance(loaded, dict):
                stored = {str(k): str(v) for k, v in loaded.items()}
    wanted = {
        # 64 bytes at least: the tokens are HS512, and PyJWT warns below that.
        "jwt_secret": lambda: base64.b64encode(secrets.token_bytes(64)).decode("ascii"),
        "api_secret_key": lambda: base64.b64encode(secrets.token_bytes(16)).decode("ascii"),
        # Fernet: 32 bytes, URL-safe base64 (what cryptography's Fernet.generate_key gives)
        "fernet_key": lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii"),
    }
    missing = [key for key in wanted if not stored.get(key)]
    if missing:
        for key in missing:
            stored[key] = wanted[key]()
        home.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(stored).encode(), mode=0o600)  # secrets: owner only
    return stored


def component_env(home: Path, dags_folder: Path, *, parallelism: int, api_port: int,
                  extra_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of every child: Airflow reads its whole configuration from it.

    Environment variables beat airflow.cfg, so an airflow.cfg left in `home` (Airflow
    writes one on first start) cannot change what matters here; `extra_env` beats
    everything, e.g. a PostgreSQL URL or `AIRFLOW__ETT__*` settings.
    """
    stored = load_or_create_secrets(home)
    api_url = f"http://127.0.0.1:{api_port}"
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        # A developer's AIRFLOW_CONFIG would otherwise be read instead of home's.
        "AIRFLOW_CONFIG": str(home / "airflow.cfg"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # LocalExecutor forks `parallelism` workers up front; the machine has 2 cores.
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        # Loopback only: the SimpleAuthManager is for development.
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__WORKERS": "1",
        # Task runners talk to the Execution API served by the api-server; the default
        # is http://localhost:8080/execution/, wrong for any other port.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": stored["jwt_secret"],
        "AIRFLOW__API__SECRET_KEY": stored["api_secret_key"],
        "AIRFLOW__CORE__FERNET_KEY": stored["fernet_key"],
        # Look for new DAG files every 2 s instead of every 300 s. Changed files are
        # re-parsed at once anyway (file_parsing_sort_mode=modified_time).
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        # An unchanged file is parsed again every 120 s, not every 30 s: each parse forks
        # a process that imports the file's modules (a quarter of what a test tier's
        # dag-processors spent). An edited DAG file is parsed at once all the same (its
        # mtime is newer than its last parse); a file it reads, within 2 minutes.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "120",
        "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
        # An edited DAG is re-serialized (so the next run uses it) at most this often:
        # 30 s by default, longer than an edit-and-trigger loop in the UI.
        "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        # The scheduler (LocalExecutor) and triggerer serve logs on fixed ports by
        # default (8793, 8794): two installations, or a Celery worker, would clash.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
    })
    env.update(extra_env)
    return env
