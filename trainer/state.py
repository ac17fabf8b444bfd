"""What a checkpoint holds, as one DCP `Stateful`: model, optimizers and RNG.

Two layouts, because the optimizers differ (see `model.py`): one process keeps a plain
module and one torch optimizer, saved through `torch.distributed.checkpoint.state_dict`
(fully qualified names, so a checkpoint does not depend on how the module is wrapped);
several processes keep a DistributedModelParallel whose sharded tables carry a fused
optimizer, saved as TorchRec lays it out (ShardedTensors that DCP places by shard).
The data cursor and step travel in the checkpoint's small JSON `extra`, next to the
RNG states, so a restore can start the data pipeline before the tensors are loaded.
"""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful


class TrainState(Stateful):
    def __init__(self, model: nn.Module, optimizers: dict[str, Any], *, sharded: bool) -> None:
        self.model = model
        self.optimizers = optimizers
        self.sharded = sharded

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            from torch.distributed.checkpoint.state_dict import get_state_dict

            (optimizer,) = self.optimizers.values()
            model_sd, optim_sd = get_state_dict(self.model, optimizer)
            return {"model": model_sd, "optim": optim_sd}
        return {
            "model": self.model.state_dict(),
            **{f"optim_{name}": opt.state_dict() for name, opt in self.optimizers.items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.sharded:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            (optimizer,) = self.optimizers.values()
            set_state_dict(self.model, optimizer, model_state_dict=state_dict["model"],
                           optim_state_dict=state_dict["optim"])
            return
        self.model.load_state_dict(state_dict["model"])
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state_dict[f"optim_{name}"])


def rng_state() -> dict[str, str]:
    """CPU (and CUDA) generator states as base64, small enough for the commit marker."""
    out = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available():
        out["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return out


def set_rng_state(saved: dict[str, str]) -> None:
    cpu = torch.frombuffer(bytearray(base64.b64decode(saved["cpu"])), dtype=torch.uint8)
    torch.set_rng_state(cpu)
    if "cuda" in saved and torch.cuda.is_available():
        cuda = torch.frombuffer(bytearray(base64.b64decode(saved["cuda"])), dtype=torch.uint8)
        torch.cuda.set_rng_state(cuda)
