"""The `airflow_ett` Airflow plugin.

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

from airflow_ett.listeners import EttListener
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
