"""A PyTorch Lightning trainer, as its team already has it, run as a lifecycle job.

A tiny regression model built from its arguments (no download), synthetic data from a
seed; the lines that make it a job are marked `# ett`. Run it alone
(`python -m airflow_ett.examples.lightning_train --steps 40 --dir /tmp/lt`) or from
`dags/ett_lightning_example.py`.
"""

from __future__ import annotations

import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from airflow_ett.adapters import job  # ett
from airflow_ett.adapters.job import EttJob
from airflow_ett.adapters.lightning import EttLightningCallback  # ett
from airflow_ett.examples import faults


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 32, lr: float = 0.05, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.step_sleep = step_sleep
        self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, 1))
        self.lr = lr

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.step_sleep:  # a heavier model's step, on a laptop
            time.sleep(self.step_sleep)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Faults(pl.Callback):
    def __init__(self, planned: list[faults.Fault], job: EttJob) -> None:
        self.planned, self.job = planned, job

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        faults.check(self.planned, trainer.global_step, self.job)


def main(argv: list[str] | None = None) -> None:
    args = faults.parser(__doc__).parse_args(argv)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    with job() as ett:  # ett
        directory = args.dir or ett.checkpoint_dir or "checkpoints"
        ckpt = pl.callbacks.ModelCheckpoint(dirpath=directory, save_last=True,
                                            every_n_train_steps=args.every, save_top_k=0)
        trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[EttLightningCallback(ett, samples_per_step=16),  # ett
                                        ckpt, Faults(args.fail, ett)])
        last = os.path.join(directory, "last.ckpt")
        trainer.fit(Regressor(step_sleep=args.step_sleep), DataLoader(data, batch_size=16),
                    ckpt_path=last if os.path.exists(last) else None)


if __name__ == "__main__":
    main()
