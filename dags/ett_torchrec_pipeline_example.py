"""Your own trainer under the lifecycle: a TorchRec `TrainPipeline` loop, wrapped by
`EttTrainPipeline`.

The trainer is `airflow_ett/examples/torchrec_pipeline_train.py`, written as its team
writes one (the lines that make it a job are marked `# ett`). It fails once on purpose (an exception
after step 8 of its first attempt) to show the in-place restart and its TTR; the train
task gives it the leave protocol's environment (docs/trainer-protocol.md).
"""

import sys

from airflow_ett.operators import training_job

dag = training_job(
    dag_id="ett_torchrec_pipeline_example",
    command=[sys.executable, "-m", "airflow_ett.examples.torchrec_pipeline_train", "--steps", "200",
             "--every", "25", "--step-sleep", "0.05", "--fail", "raise@8@1"],
    model="torchrec_pipeline_example",
    tenant="demo",
    restarts=2,
    description="a TorchRec `TrainPipeline` loop, run as a lifecycle job",
    is_paused_upon_creation=False,
)
