"""`ett_dlrm_demo` with every optimization off: cold compile, synchronous checkpoints,
no fast batch, serial init, and the model published inside the train task."""

from datetime import timedelta

from airflow_ett.operators import training_job

dag = training_job(
    dag_id="ett_dlrm_baseline",
    tenant="demo",
    model="dlrm_small",
    steps=400,
    checkpoint_interval=60,
    faults=[{"kind": "kill", "at_step": 330, "attempt": 1}],
    retries=2,
    retry_delay=timedelta(seconds=5),
    restarts=1,
    optimizations={name: False for name in ("fast_batch", "parallel_init", "compile_cache",
                                             "async_checkpoint", "standalone_publish")},
    trainer_options={"batch_size": 256, "step_sleep_s": 0.02, "data_startup_latency_s": 2.0},
    description="ETT baseline: the demo job with the optimizations off",
)
