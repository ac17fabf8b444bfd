"""Days as the rollup of version 1 stored them (seconds over seconds), for the test of store
migration 0003, which reweighs them by GPU time (decision 0010).

`v1_days.json` holds the `ett_daily_days` and `ett_daily_groups` rows that the rollup of
commit 508ea87 (the last to weigh seconds) wrote for `JOB_DAYS`; it was made by running
this module with that commit's package first on the path:

    git archive 508ea87 airflow_ett | tar -x -C /tmp/v1
    PYTHONPATH=/tmp/v1 .venv/bin/python -m tests.store.v1_days tests/store/v1_days.json

The test rolls the same job-days up with today's code and expects the migrated rows to
be what it stores.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.rollup import ComponentsConfig, JobDay, job_day, load_components
from tests.rollup.scenarios import LO, WINDOW, issue_day_jobs, job_a, job_b

FIXTURE: Final = Path(__file__).with_name("v1_days.json")
COMPUTED_AT: Final = LO + 5 * 86400.0
SILENT_AFTER_S: Final = 86400.0


def components() -> ComponentsConfig:
    """The bundled components, named alike wherever the package is installed."""
    return dataclasses.replace(load_components(), source="components.toml")


def job_days() -> dict[str, list[JobDay]]:
    """Day D of tests/rollup/scenarios.py (2 GPUs and 1), issue 22's day (8 GPUs and 1),
    and a day with no job."""
    scenario = []
    for events in (job_a(), job_b()):
        a = attribute_job(events)
        d = job_day(a, WINDOW, gpus=a.world_size)
        assert d is not None
        scenario.append(d)
    return {"2026-11-28": scenario, "2026-11-29": issue_day_jobs("2026-11-29"),
            "2026-11-30": []}


def _rows(url: str, table: str) -> list[dict[str, Any]]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.text(f"SELECT * FROM {table}"))]
    engine.dispose()
    return rows


def write_fixture(out: Path) -> None:
    """Roll `job_days()` up with the package on the path and dump the rows it stores."""
    import datetime as dt

    from airflow_ett.rollup import day_parts, day_window, rollup_of_parts
    from airflow_ett.store import EttStore, upgrade

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/v1.db"
        upgrade(url, "0002")
        with EttStore(url) as store:
            for day, days in job_days().items():
                window = day_window(dt.date.fromisoformat(day), "UTC")
                parts = day_parts(days, cut_pct=50.0, start_s=60.0)
                rollup = rollup_of_parts(window, parts, components(), computed_at=COMPUTED_AT,
                                         silent_after_s=SILENT_AFTER_S)
                store.daily.replace(rollup, days, parts)
        fixture = {table: _rows(url, table) for table in ("ett_daily_days", "ett_daily_groups")}
    out.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_fixture(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE)
