"""Provider metadata: how Airflow learns about the `[ett]` config section.

Airflow reads `get_provider_info()` through the `apache_airflow_provider` entry point, so
`airflow config list` shows our section with its defaults and descriptions. The same
defaults serve processes that never import Airflow (see `settings.py`). Keep this module
free of imports: every Airflow process loads it.
"""

from __future__ import annotations

from typing import Any, Final

CONFIG_DEFAULTS: Final[dict[str, str]] = {
    "store_url": "sqlite:///{AIRFLOW_HOME}/ett.db",
    "disabled": "False",
    "spool_dir": "{AIRFLOW_HOME}/ett_spool",
    "emit_timeout": "2.0",
    "work_dir": "{AIRFLOW_HOME}/ett_work",
    "rollup_timezone": "UTC",
    "components_file": "",
    "rollup_recompute_days": "2",
    "rollup_catchup_days": "30",
    "report_dir": "{AIRFLOW_HOME}/ett_reports",
    "whatif_cut_pct": "50",
    "whatif_start_s": "60",
    "rollup_silent_after_s": "86400",
    "tenants_file": "",
    "rolling_windows": "5,15,60",
    "rolling_metrics_interval_s": "60",
}

_DESCRIPTIONS: Final[dict[str, tuple[str, str]]] = {
    "store_url": (
        "SQLAlchemy URL of the ETT store (its own database, never Airflow's metadata "
        "session). SQLite under AIRFLOW_HOME by default; PostgreSQL in production, e.g. "
        "postgresql+psycopg2://user@host/ett.",
        "string",
    ),
    "disabled": (
        "Turn all ETT recording off: listeners and the emitter do nothing.",
        "boolean",
    ),
    "spool_dir": (
        "Where events wait, append-only, while the store cannot be reached. They are "
        "replayed at the next start or by `airflow-ett spool replay`.",
        "string",
    ),
    "emit_timeout": (
        "The longest, in seconds, that recording may hold up the task it observes "
        "(flush at exit included). What is not written by then is spooled.",
        "float",
    ),
    "work_dir": (
        "Where lifecycle DAGs keep their files: a directory per job (trainer config, "
        "checkpoints), the shared compile cache and published models. On a fleet, a path "
        "every worker mounts (the train task's retry restores from its checkpoints).",
        "string",
    ),
    "rollup_timezone": (
        "The time zone (an IANA name) whose calendar days the nightly rollup and the "
        "reports count in; a job across midnight is split at this zone's midnight.",
        "string",
    ),
    "components_file": (
        "A TOML file naming each Level-2 component's owning team and SLO (see the bundled "
        "airflow_ett/rollup/components.toml); empty for the bundled default.",
        "string",
    ),
    "rollup_recompute_days": (
        "Each nightly rollup recomputes this many days, ending with the day it is for, so "
        "that events arriving late correct the days they belong to.",
        "integer",
    ),
    "rollup_catchup_days": (
        "The most missed days the nightly rollup DAG catches up on after a pause.",
        "integer",
    ),
    "report_dir": (
        "Where the nightly rollup writes each day's report files (<report_dir>/<date>/).",
        "string",
    ),
    "whatif_cut_pct": (
        "The what-if of the reports: the fleet ETT% if a component were cut by this many "
        "percent.",
        "float",
    ),
    "whatif_start_s": (
        "The what-if of the reports: the fleet ETT% if every start (repeated by every "
        "recovery) were this many seconds faster.",
        "float",
    ),
    "rollup_silent_after_s": (
        "A job that has not ended and sent no event for this many seconds is counted by "
        "the rollup only up to this long after its last event (an abandoned job: its "
        "worker died unseen, its events were lost), and the days say how many were cut "
        "so. Set it above the longest silence of a live job (a queue wait, a data load); "
        "0 counts every unended job up to now.",
        "float",
    ),
    "tenants_file": (
        "A TOML file of tenant policies (priority, GPU quota, borrowing limit, preemption "
        "knobs; see airflow_ett/scheduling/tenants.example.toml) that the scheduling "
        "plugin's cluster policies and priority strategy apply; empty turns them off. A "
        "broken file keeps the last good version in force.",
        "string",
    ),
    "rolling_windows": (
        "The rolling windows of a running job, in whole minutes separated by commas: its "
        "ETT% and components over each of its last so many minutes, on the run page, in "
        "its JSON API and as gauges. Empty for none; at most 8 windows of 1 to 10080 "
        "minutes (a week).",
        "string",
    ),
    "rolling_metrics_interval_s": (
        "How often, in seconds, the train task's process sends its job's rolling-window "
        "gauges (docs/metrics.md) while it runs: each time it reads the job's events from "
        "the store and attributes them. 0 sends none; else 10 to 3600.",
        "float",
    ),
}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-ett",
        "name": "Effective Training Time (ETT)",
        "description": "Training-job lifecycles with every wasted GPU-minute measured.",
        "versions": ["0.1.0"],
        "config": {
            "ett": {
                "description": "Effective Training Time recording.",
                "options": {
                    key: {
                        "description": _DESCRIPTIONS[key][0],
                        "version_added": "0.1.0",
                        "type": _DESCRIPTIONS[key][1],
                        "example": None,
                        "default": default,
                    }
                    for key, default in CONFIG_DEFAULTS.items()
                },
            }
        },
    }
