"""A real Airflow (SQLite + LocalExecutor) run as separate processes, for demos and tests.

`airflow standalone` is not used: on stop it left its children running. Instead each
component (`dag-processor`, `scheduler`, `triggerer`, `api-server`) is its own `airflow`
CLI process in its own session and process group, with its own log file, and `stop()`
ends every process it started, and every descendant it has seen, by pid.

Nothing here imports Airflow: this package runs in the caller's process (a test, the
`airflow-ett` CLI), where importing Airflow would cost seconds and freeze its
configuration before `AIRFLOW_HOME` is chosen. Triggering and polling go through the
REST API (one HTTP call is milliseconds; each `airflow` CLI call pays ~3-5 s of imports).

One module per concern: `config` (executables, ports, secrets, the components'
environment), `processes` (starting, watching and ending them), `rest` and `health` (the
REST API and its health endpoint), `auth` (the admin login), `harness` (`EmbeddedAirflow`,
which ties them together), `session` (run one DAG, serve until Ctrl-C), `errors`. What
callers use is importable from here.
"""

from __future__ import annotations

from airflow_ett.embedded.auth import admin_password, login_info
from airflow_ett.embedded.config import SECRETS_FILE, airflow_executable, free_port, venv_script
from airflow_ett.embedded.errors import (
    ComponentDied,
    DagImportError,
    EmbeddedAirflowError,
    RunTimeout,
)
from airflow_ett.embedded.harness import EmbeddedAirflow
from airflow_ett.embedded.processes import DEFAULT_COMPONENTS
from airflow_ett.embedded.session import (
    RunResult,
    run_dag,
    serve_until_interrupted,
    terminate_as_interrupt,
)

__all__ = [
    "DEFAULT_COMPONENTS",
    "SECRETS_FILE",
    "ComponentDied",
    "DagImportError",
    "EmbeddedAirflow",
    "EmbeddedAirflowError",
    "RunResult",
    "RunTimeout",
    "admin_password",
    "airflow_executable",
    "free_port",
    "login_info",
    "run_dag",
    "serve_until_interrupted",
    "terminate_as_interrupt",
    "venv_script",
]
