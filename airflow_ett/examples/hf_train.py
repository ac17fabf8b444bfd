"""A Hugging Face `Trainer` job, as its team already has it, run as a lifecycle job.

A one-layer GPT-2 built from a config (no download) learns a synthetic token sequence;
the lines that make it a job are marked `# ett`. Run it alone
(`python -m airflow_ett.examples.hf_train --steps 40 --dir /tmp/hf`) or from
`dags/ett_hf_example.py`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

from airflow_ett.adapters import job  # ett
from airflow_ett.adapters.hf import EttHFCallback  # ett
from airflow_ett.adapters.job import EttJob
from airflow_ett.examples import faults

BATCH = 8


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 256, length: int = 16, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class Faults(TrainerCallback):
    def __init__(self, planned: list[faults.Fault], step_sleep: float, job: EttJob) -> None:
        self.planned, self.step_sleep, self.job = planned, step_sleep, job

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step_sleep:  # a heavier model's step, on a laptop
            time.sleep(self.step_sleep)
        faults.check(self.planned, state.global_step, self.job)


def main(argv: list[str] | None = None) -> None:
    args = faults.parser(__doc__).parse_args(argv)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    with job() as ett:  # ett
        out = args.dir or str(ett.checkpoint_dir or "checkpoints")
        training = TrainingArguments(output_dir=out, max_steps=args.steps,
                                     save_steps=args.every, per_device_train_batch_size=BATCH,
                                     report_to=[], use_cpu=True, disable_tqdm=True,
                                     logging_strategy="no", seed=0)
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(),
                          callbacks=[Faults(args.fail, args.step_sleep, ett),
                                     EttHFCallback(ett, samples_per_step=BATCH)])  # ett
        trainer.train(resume_from_checkpoint=get_last_checkpoint(out))  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
