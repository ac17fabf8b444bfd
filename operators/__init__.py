"""Airflow operators for training-job lifecycles (installed as `airflow_ett.operators`).

`training_job(...)` builds a whole lifecycle DAG (for our trainer on your model, or around
your own trainer's `command`); the operators can also be used one by one in a DAG of your
own (tag it `ett` to have the listeners record it).
"""

from airflow_ett.operators.errors import (
    TrainerApplicationError,
    TrainerConfigError,
    TrainerFailed,
    TrainerInfraFailure,
    TrainerPreempted,
)
from airflow_ett.operators.job import JobConfigError
from airflow_ett.operators.lifecycle import training_job
from airflow_ett.operators.prewarm import CompileCachePrewarmOperator
from airflow_ett.operators.publish import PublishModelOperator, model_asset
from airflow_ett.operators.train import CommandTrainOperator, TorchRecTrainOperator

__all__ = [
    "CommandTrainOperator",
    "CompileCachePrewarmOperator",
    "JobConfigError",
    "PublishModelOperator",
    "TorchRecTrainOperator",
    "TrainerApplicationError",
    "TrainerConfigError",
    "TrainerFailed",
    "TrainerInfraFailure",
    "TrainerPreempted",
    "model_asset",
    "training_job",
]
