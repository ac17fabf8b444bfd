"""A TorchRec `TrainPipeline` loop, as a team writes one, run as a lifecycle job.

TorchRec's own DLRM on TorchRec's random recommendation data (no download), stepped by
`TrainPipelineBase` (`TrainPipelineSparseDist` on sharded GPUs is wrapped the same way);
checkpoints are the team's own (`torch.save`, written whole then renamed). The lines that
make it a job are marked `# ett`. Run it alone
(`python -m airflow_ett.examples.torchrec_pipeline_train --steps 40 --dir /tmp/tr`) or
from `dags/ett_torchrec_pipeline_example.py`.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed.train_pipeline import TrainPipelineBase
from torchrec.models.dlrm import DLRM, DLRMTrain

from airflow_ett.adapters import job  # ett
from airflow_ett.adapters.torchrec import EttTrainPipeline  # ett
from airflow_ett.examples import faults, torch_state

KEYS = ["user", "item"]
BATCH = 32


class Slow(torch.nn.Module):
    """The model, each step `seconds` longer (a heavier model's step, on a laptop)."""

    def __init__(self, inner: torch.nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner, self.seconds = inner, seconds

    def forward(self, batch: object) -> object:
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner(batch)


def build() -> DLRMTrain:
    tables = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=8, num_embeddings=100,
                                 feature_names=[k]) for k in KEYS]
    return DLRMTrain(DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables),
                          dense_in_features=8, dense_arch_layer_sizes=[16, 8],
                          over_arch_layer_sizes=[16, 1]))


def main(argv: list[str] | None = None) -> None:
    args = faults.parser(__doc__).parse_args(argv)
    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    with job() as ett:  # ett
        directory = Path(args.dir or ett.checkpoint_dir or "checkpoints")
        with ett.phase("checkpoint_restore"):  # ett
            step = torch_state.restore(directory, model, optimizer) or 0

        def save() -> None:
            torch_state.save(directory, model, optimizer, step)

        data = RandomRecDataset(keys=KEYS, batch_size=BATCH, hash_size=100, num_dense=8,
                                manual_seed=0, num_generated_batches=-1)
        batches = itertools.islice(iter(data), step, None)  # resume the data at its step
        pipeline: EttTrainPipeline[object, object] = EttTrainPipeline(  # ett
            TrainPipelineBase(Slow(model, args.step_sleep), optimizer, torch.device("cpu")),
            ett, start_step=step, samples_per_step=BATCH)  # ett
        while step < args.steps and not ett.should_leave:
            pipeline.progress(batches)
            step = pipeline.step
            faults.check(args.fail, step, ett)
            if step % args.every == 0 or step == args.steps:
                with ett.checkpoint(step, step * BATCH):  # ett
                    save()
        if ett.should_save:  # ett: SIGTERM between two saves
            with ett.checkpoint(step, step * BATCH):
                save()


if __name__ == "__main__":
    main()
