"""Your model and your data: the two-tower example over a Criteo-layout TSV log.

The model is `airflow_ett/examples/two_tower.py`, written as a model owner writes one;
the data is generated, never downloaded. Make it before the first run:

    python -m airflow_ett.examples.make_data --out "$AIRFLOW_HOME/example_data"

The trigger form's `data_paths` points a run at other files (the Parquet copy:
`.../day_*.parquet` with `format` parquet needs its own DAG), `model_config` changes the
model, and `inject_fault` kills the trainer to watch it resume.
"""

import os
from pathlib import Path

from airflow_ett.examples.make_data import schema
from airflow_ett.operators import training_job

DATA = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "example_data"

dag = training_job(
    dag_id="ett_two_tower_example",
    model="airflow_ett.examples.two_tower:build",
    model_config={"embedding_dim": 16, "tower": [64, 32]},
    data={"format": "criteo_tsv", "paths": str(DATA / "day_*.tsv"), "schema": schema()},
    steps=300,
    tenant="demo",
    checkpoint_interval=50,
    faults=[{"kind": "kill", "at_step": 120, "attempt": 1}],
    trainer_options={"batch_size": 256, "step_sleep_s": 0.02},
    description="An owner's two-tower model on an owner's TSV files",
    is_paused_upon_creation=False,
)
