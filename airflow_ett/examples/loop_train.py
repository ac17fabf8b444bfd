"""A bare PyTorch training loop run as a lifecycle job: the context-manager adapter.

A small MLP on seeded synthetic data, checkpoints of its own (`torch.save`, written whole
then renamed). The lines that make it a job are marked `# ett`. Run it alone
(`python -m airflow_ett.examples.loop_train --steps 40 --dir /tmp/loop`) or from
`dags/ett_loop_example.py`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from airflow_ett.adapters import job  # ett
from airflow_ett.examples import faults, torch_state

BATCH = 16


def main(argv: list[str] | None = None) -> None:
    args = faults.parser(__doc__).parse_args(argv)
    with job() as ett:  # ett
        with ett.phase("model_creation"):  # ett
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        directory = Path(args.dir or ett.checkpoint_dir or "checkpoints")
        with ett.phase("checkpoint_restore"):  # ett
            step = torch_state.restore(directory, model, optimizer) or 0
        ett.resumed(step, step * BATCH)  # ett

        def save() -> None:
            torch_state.save(directory, model, optimizer, step)

        while step < args.steps and not ett.should_leave:  # ett: leave when asked
            ett.begin_step()  # ett
            g = torch.Generator().manual_seed(step)  # the data of step `step`, resumable
            x = torch.randn(BATCH, 8, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if args.step_sleep:  # a heavier model's step, on a laptop
                time.sleep(args.step_sleep)
            step += 1
            ett.step(step, step * BATCH, loss=loss.item())  # ett
            faults.check(args.fail, step, ett)
            if step % args.every == 0 or step == args.steps:
                with ett.checkpoint(step, step * BATCH):  # ett
                    save()
        if ett.should_save:  # ett: SIGTERM between two saves
            with ett.checkpoint(step, step * BATCH):
                save()


if __name__ == "__main__":
    main()
