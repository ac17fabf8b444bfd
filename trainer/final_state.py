"""The trainer's results, read back: the model tensors of the newest valid checkpoint.

`restore_final_state` loads them on CPU, in this process alone, through the same
validation as a restart (markers, checksums, fallback to older checkpoints), and says
which point of the run they are (step, cursor) and which newer checkpoints it rejected.
It is the one way the trainer's results leave it: publishing (`publish.py`), the tests
and the benchmarks read through it, never the checkpoint files themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful

from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.model import build_for
from airflow_ett.trainer.state import TrainExtra, read_train_extra


@dataclass(frozen=True, slots=True)
class FinalState:
    """The model tensors of the newest valid checkpoint, and where in training they are.

    `step` and `cursor` come from the checkpoint's commit marker (`extra`), so whoever ships
    the tensors can say exactly which point of the run they are; `skipped` lists the newer
    checkpoints that were rejected (no marker, damaged files...) with why.
    """

    tensors: dict[str, torch.Tensor]
    step: int
    cursor: int | None
    path: Path
    extra: TrainExtra
    skipped: list[tuple[Path, str]]


class _ModelOnly(Stateful):
    """A checkpoint's `train` entry seen through the model alone (its state dicts typed
    as torch's `Stateful` protocol types them: these override it).

    DCP loads only the keys asked for, so the optimizer state (as big as the model with
    Adagrad) is never read, and the same request fits both layouts of `TrainState`: one
    process (`{"model", "optim"}`) and several (`{"model", "optim_dense", "optim_sparse"}`,
    the tables as ShardedTensors that DCP reassembles into whole tensors here). Loading a
    multi-rank checkpoint with a plain optimizer fails on the optimizer keys instead.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(self.model)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state_dict["model"])


def restore_final_state(cfg: TrainerConfig) -> FinalState:
    """Load the newest valid committed checkpoint of `cfg.checkpoint_dir` on CPU, in this
    process alone, through the same validation as a restart (markers, checksums, fallback
    to older checkpoints). The one way the trainer's results leave it (tests, publish).

    Call it outside torch.distributed (or on every rank): with a process group the
    manager's restore is collective. Raises FileNotFoundError naming the directory when it
    holds no committed checkpoint that loads (the skipped ones are logged with why), and
    `CheckpointError` when a load failed half-way with nothing older to fall back to.
    """
    from airflow_ett.trainer.checkpoint import CheckpointManager

    directory = Path(cfg.checkpoint_dir)
    if not directory.is_dir():  # the manager would create it: a reader must not
        raise FileNotFoundError(f"no checkpoint directory {directory}")
    model = build_for(cfg).module
    manager = CheckpointManager(directory, keep_last=cfg.keep_last, async_save=False)
    try:
        result = manager.restore({"train": _ModelOnly(model)})
    finally:
        manager.close()
    if result is None:
        invalid = len(list(directory.glob("step-*")))
        raise FileNotFoundError(
            f"no committed checkpoint in {directory}"
            + (f" ({invalid} step directories, none valid: see the warnings)" if invalid else "")
        )
    extra = read_train_extra(result.extra, where=str(result.path))
    return FinalState(
        tensors={k: v.detach().clone() for k, v in model.state_dict().items()},
        step=result.step,
        cursor=extra["cursor"],
        path=result.path,
        extra=extra,
        skipped=list(result.skipped),
    )


def load_final_state(cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """The newest checkpoint's model tensors, on CPU (what the publish step ships)."""
    return restore_final_state(cfg).tensors
