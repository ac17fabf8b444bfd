"""One real Airflow for every module here: SQLite, LocalExecutor with 3 slots, and the
scheduler, dag-processor and API server as processes (no triggerer: tests/components.py).

Starting an Airflow costs about 25 CPU-s (the API server alone 10-14) and 15-35 s before
it answers; these modules need the same one, each with DAG files of its own. So one
pytest worker runs them one after the other (the package is in tests/conftest.py's
`SHARED_PACKAGES`), the package fixture `shared_airflow` (conftest.py) starts the Airflow
once, and each module asks `dag_folder` for a folder of the shared DAGs folder to write
its files into; the dag-processor finds a new file within 2 s. The Airflow stops once
the package's last test has run.

What the modules share is therefore Airflow's state and the ETT store: a test reads its
own job's events, runs, checkpoints and import errors (by job id, run id, DAG id, file),
never the whole store or work dir. The TMPDIR is the package's own, so the demo's
prewarm finds no inductor files but those of this package's jobs.
"""

from __future__ import annotations

from pathlib import Path

from airflow_ett.embedded import EmbeddedAirflow


def dag_folder(af: EmbeddedAirflow, name: str) -> Path:
    """A new folder `name` in the shared Airflow's DAGs folder, for one module's files
    (its `.airflowignore` applies to that folder alone)."""
    folder = af.dags_folder / name
    folder.mkdir()
    return folder
