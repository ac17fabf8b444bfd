"""The `airflow_ett` Airflow plugin: the package of what Airflow loads into its processes.

`listeners` records task-level boundaries; the scheduling plugin's policy and priority
strategy and the UI's pages will live beside it. The decisions they make are pure
functions elsewhere (`airflow_ett.ett`, `airflow_ett.jobs`); this package only wires them
to Airflow's hooks.

Airflow instantiates registered plugins in every one of its processes (scheduler, API
server, workers, task runners), so this module imports only what the listener needs (no
torch, no SQLAlchemy models, no store until a hook needs it). With `[ett] disabled` no
listener is registered at all; a configuration that cannot be read leaves the listener
registered, since each hook checks the setting again and records nothing when it is off.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_ett.plugin.listeners import EttListener
from airflow_ett.settings import EttSettings, SettingsError

log = logging.getLogger(__name__)


def _listeners() -> list[Any]:
    try:
        if EttSettings.load().disabled:
            return []
    except SettingsError as exc:
        log.warning("airflow_ett: %s; the listener will check again at each hook", exc)
    return [EttListener()]


class AirflowEttPlugin(AirflowPlugin):
    name = "airflow_ett"
    listeners = _listeners()
