"""The demo lifecycle: the small DLRM on CPU, every optimization on, one injected failure.

The trigger form (DAG params) changes the steps and the injected failure per run.
`ett_dlrm_baseline` is the same job with the optimizations off, for comparison.
"""

from datetime import timedelta

from airflow_ett.operators import training_job

dag = training_job(
    dag_id="ett_dlrm_demo",
    tenant="demo",
    model="dlrm_small",
    steps=400,
    checkpoint_interval=60,
    faults=[{"kind": "kill", "at_step": 330, "attempt": 1}],
    retries=2,
    retry_delay=timedelta(seconds=5),
    restarts=1,
    trainer_options={"batch_size": 256, "step_sleep_s": 0.02, "data_startup_latency_s": 2.0},
    description="ETT demo: DLRM small, all optimizations on, one injected failure",
)
