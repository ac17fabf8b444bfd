"""The `airflow_ett` Airflow plugin.

Airflow instantiates registered plugins in every one of its processes (scheduler, API
server, workers, task runners), so this module imports nothing heavy at load time.
Listeners, the UI pages and the scheduling hooks attach here as they land.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class AirflowEttPlugin(AirflowPlugin):
    name = "airflow_ett"
