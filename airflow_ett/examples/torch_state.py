"""A team's own checkpoints, as the example loops keep them: the model, the optimizer and
the step in one `torch.save` file, written whole then renamed over the last one."""

from __future__ import annotations

import os
from pathlib import Path

import torch

FILE = "state.pt"


def restore(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
            ) -> int | None:
    """Load the newest state into `model` and `optimizer`; its step, or None (none yet)."""
    path = directory / FILE
    if not path.exists():
        return None
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         step: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step}, directory / "state.tmp")
    os.replace(directory / "state.tmp", directory / FILE)
