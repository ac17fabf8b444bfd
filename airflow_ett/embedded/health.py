"""Reading Airflow's health endpoint (GET /api/v2/monitor/health): which started
components are not up yet."""

from __future__ import annotations

from collections.abc import Container, Mapping
from datetime import UTC, datetime
from typing import Any

# Which health entry proves each component is up, and the heartbeat inside it.
_HEALTH_KEYS = {
    "scheduler": "scheduler",
    "triggerer": "triggerer",
    "dag-processor": "dag_processor",
}
_HEARTBEAT_KEYS = {
    "scheduler": "latest_scheduler_heartbeat",
    "triggerer": "latest_triggerer_heartbeat",
    "dag_processor": "latest_dag_processor_heartbeat",
}


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def unhealthy(health: Mapping[str, Any], started: Container[str],
              since: datetime | None) -> list[str]:
    """Started components whose health entry is not fresh from this start (`since`)."""
    waiting = []
    if health.get("metadatabase", {}).get("status") != "healthy":
        waiting.append("metadatabase")
    for name, key in _HEALTH_KEYS.items():
        if name not in started:
            continue
        entry = health.get(key) or {}
        beat = _parse_time(entry.get(_HEARTBEAT_KEYS[key]))
        # A job row from an earlier start can still look healthy for a while.
        fresh = beat is not None and (since is None or beat >= since)
        if entry.get("status") != "healthy" or not fresh:
            waiting.append(name)
    return waiting
