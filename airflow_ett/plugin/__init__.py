"""The `airflow_ett` Airflow plugin: the package of what Airflow loads into its processes.

`listeners` records task-level boundaries; `web` is the ETT pages inside the Airflow UI
(a FastAPI app at `/ett`, a nav entry and a tab on each DAG run); `priority` the tenants'
aged priority strategy, which `policy` (the cluster policies, loaded by Airflow through the
`airflow.policy` entry point, not by this class) sets on lifecycle tasks. The decisions
they make are pure functions elsewhere (`airflow_ett.ett`, `airflow_ett.rollup`,
`airflow_ett.scheduling`, `airflow_ett.jobs`); this package only wires them to Airflow's
hooks.

Airflow instantiates registered plugins in every one of its processes (scheduler, API
server, workers, task runners), so this module imports only what the listener needs (no
torch, no SQLAlchemy models, no store until a hook needs it), and the web app is built
only when something reads the plugin's `fastapi_apps`: Airflow does that when its API
server creates its app (and when it lists plugins: `airflow plugins`, GET
/api/v2/plugins), never in the scheduler, the dag processor, the triggerer or a task.
With `[ett] disabled` no listener is registered at all (the pages still show what is
stored); a configuration that cannot be read leaves the listener registered, since each
hook checks the setting again and records nothing when it is off.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_ett.plugin.listeners import EttListener
from airflow_ett.plugin.priority import EttTenantPriority
from airflow_ett.plugin.web.views import APP_NAME, URL_PREFIX, external_views
from airflow_ett.settings import EttSettings, SettingsError

log = logging.getLogger(__name__)


def _listeners() -> list[Any]:
    try:
        if EttSettings.load().disabled:
            return []
    except SettingsError as exc:
        log.warning("airflow_ett: %s; the listener will check again at each hook", exc)
    return [EttListener()]


class _WebApps:
    """`fastapi_apps` as a descriptor: the list Airflow mounts, built on the first read.

    Building imports FastAPI, Airflow's security module and the store package; done once
    per process, under a lock (the API server may read it from several threads). If the
    app cannot be built, the API server still starts, without the pages, and says why.
    """

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def __get__(self, obj: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            with self._lock:
                if self._apps is None:
                    self._apps = self._build()
        return self._apps

    @staticmethod
    def _build() -> list[dict[str, Any]]:
        try:
            from airflow_ett.plugin.web.app import create_app

            return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": APP_NAME}]
        except Exception:
            log.exception("airflow_ett: the ETT pages could not be built; the API server "
                          "runs without them")
            return []


class AirflowEttPlugin(AirflowPlugin):
    name = "airflow_ett"
    listeners = _listeners()
    fastapi_apps = _WebApps()
    external_views = external_views()
    # registered so that a DAG whose tasks the cluster policy gave it can be serialized
    # and read back (`plugin/policy.py`)
    priority_weight_strategies = [EttTenantPriority]  # noqa: RUF012 (Airflow reads the class)
