"""Adapters: any trainer under the lifecycle, each a thin layer over the emitter and the
leave protocol (docs/trainer-protocol.md).

- `job()` (`adapters.job`): a `with` block around any PyTorch loop;
- `EttTrainPipeline` (`adapters.torchrec`): wraps a TorchRec `TrainPipeline`;
- `EttLightningCallback` (`adapters.lightning`, extra `airflow-ett[lightning]`);
- `EttHFCallback` (`adapters.hf`, extra `airflow-ett[hf]`).

Each library is imported only by its own module.
"""

from airflow_ett.adapters.job import EttJob, Refused, job

__all__ = ["EttJob", "Refused", "job"]
