"""What a checkpoint holds, as one DCP `Stateful`: model, optimizers and RNG.

Two layouts, because the optimizers differ (see `model.py`): one process keeps a plain
module and one torch optimizer, saved through `torch.distributed.checkpoint.state_dict`
(fully qualified names, so a checkpoint does not depend on how the module is wrapped);
several processes keep a DistributedModelParallel whose sharded tables carry a fused
optimizer, saved as TorchRec lays it out (ShardedTensors that DCP places by shard).
The data cursor and step travel in the checkpoint's small JSON `extra` (`TrainExtra`),
next to the RNG states, so a restore can start the data pipeline before the tensors are
loaded.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from airflow_ett.ett.events import MAX_WORLD_SIZE
from airflow_ett.trainer.readers import Reader


class TrainState(Stateful):
    """The `train` entry of a checkpoint. Its state dicts (tensors, ShardedTensors,
    nested optimizer state) are typed as torch's `Stateful` protocol types them: these
    override it."""

    def __init__(self, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer], *,
                 sharded: bool) -> None:
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


class RngState(TypedDict):
    """The generators' states, base64 (`rng_state` writes it, `set_rng_state` reads it)."""

    cpu: str
    cuda: NotRequired[str]


class TrainExtra(TypedDict):
    """A trainer checkpoint's `extra` (its commit marker's JSON): where in training it is
    and whose it is. One writer (`train_extra`, at each of the trainer's saves), one
    reader (`read_train_extra`: discovery and restore, the preflight's owner check, the
    final state a publish ships). Fields an older trainer did not write are optional."""

    step: int
    cursor: int  # the data cursor: samples consumed by the whole job
    rng: NotRequired[RngState]
    model: NotRequired[str]  # the model's name
    model_identity: NotRequired[str]  # what preflight compares (`ModelSpec.identity`)
    world_size: NotRequired[int]
    bad_rows: NotRequired[int]  # the job's bad rows skipped so far (`BadRows`)


class ExtraError(ValueError):
    """A checkpoint's `extra` that is not a `TrainExtra`; the message names the field."""


def train_extra(*, step: int, cursor: int, model: str, model_identity: str,
                world_size: int, bad_rows: int) -> TrainExtra:
    """The `extra` of a save at `step` (with this process's generator states)."""
    return {"step": step, "cursor": cursor, "rng": rng_state(), "model": model,
            "model_identity": model_identity, "world_size": world_size,
            "bad_rows": bad_rows}


def read_train_extra(raw: object, *, where: str) -> TrainExtra:
    """A checkpoint's `extra` (as the marker holds it: input from another process, maybe
    an older trainer's) checked field by field; `ExtraError` naming `where` and the
    field. Keys it does not know are left out."""
    r = Reader(f"checkpoint {where}: extra", ExtraError)
    table = r.mapping("extra", raw)
    out: TrainExtra = {
        "step": r.integer("step", table.get("step"), minimum=0),
        "cursor": r.integer("cursor", table.get("cursor"), minimum=0),
    }
    if table.get("rng") is not None:
        out["rng"] = _rng(r, table["rng"])
    if table.get("model") is not None:
        out["model"] = r.text("model", table["model"])
    if table.get("model_identity") is not None:
        out["model_identity"] = r.text("model_identity", table["model_identity"])
    if table.get("world_size") is not None:
        out["world_size"] = r.integer("world_size", table["world_size"], minimum=1,
                                      maximum=MAX_WORLD_SIZE)
    if table.get("bad_rows") is not None:
        out["bad_rows"] = r.integer("bad_rows", table["bad_rows"], minimum=0)
    return out


def _rng(r: Reader, raw: object) -> RngState:
    table: Mapping[str, object] = r.mapping("rng", raw, known=("cpu", "cuda"))
    out: RngState = {"cpu": r.text("rng.cpu", table.get("cpu"))}
    if table.get("cuda") is not None:
        out["cuda"] = r.text("rng.cuda", table["cuda"])
    return out


def rng_state() -> RngState:
    """CPU (and CUDA) generator states as base64, small enough for the commit marker."""
    out: RngState = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available():
        out["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return out


def set_rng_state(saved: RngState) -> None:
    cpu = torch.frombuffer(bytearray(base64.b64decode(saved["cpu"])), dtype=torch.uint8)
    torch.set_rng_state(cpu)
    if "cuda" in saved and torch.cuda.is_available():
        cuda = torch.frombuffer(bytearray(base64.b64decode(saved["cuda"])), dtype=torch.uint8)
        torch.cuda.set_rng_state(cuda)
