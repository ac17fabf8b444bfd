"""The demo lifecycle: the small DLRM on CPU, every optimization on, one injected failure
(the job's options: `airflow_ett/examples/dlrm_demo.py`).

The trigger form (DAG params) changes the steps and the injected failure per run.
`ett_dlrm_baseline` is the same job with the optimizations off, for comparison.
"""

from airflow_ett.examples.dlrm_demo import DEMO_JOB
from airflow_ett.operators import training_job

dag = training_job(
    dag_id="ett_dlrm_demo",
    description="ETT demo: DLRM small, all optimizations on, one injected failure",
    # Unpaused on arrival: schedule=None, so it runs only when triggered (UI or CLI).
    is_paused_upon_creation=False,
    **DEMO_JOB,
)
