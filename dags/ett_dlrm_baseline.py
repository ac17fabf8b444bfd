"""`ett_dlrm_demo` with every optimization off: cold compile, synchronous checkpoints,
no fast batch, serial init, and the model published inside the train task."""

from airflow_ett.examples.dlrm_demo import ALL_OFF, DEMO_JOB
from airflow_ett.operators import training_job

dag = training_job(
    dag_id="ett_dlrm_baseline",
    description="ETT baseline: the demo job with the optimizations off",
    # Unpaused on arrival: schedule=None, so it runs only when triggered (UI or CLI).
    is_paused_upon_creation=False,
    optimizations=ALL_OFF,
    **DEMO_JOB,
)
