"""The model a job trains, from its `ModelSpec` through the model contract, and its optimizers.

One process: the owner's module as built, trained by one torch optimizer (Adagrad) over
every parameter. Several processes: the module wrapped in `DistributedModelParallel`,
which shards its TorchRec tables (gloo on CPU, NCCL on GPU); the tables then get a
*fused* optimizer (row-wise Adagrad) applied in backward and the dense parameters a plain
Adagrad. That split is forced by facts measured on this machine (issue 3): the planner
picks fused kernels, so a plain optimizer over `model.parameters()` never updates sharded
tables, and DCP cannot place a plain optimizer's state for model-parallel tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from airflow_ett.trainer import require_torchrec
from airflow_ett.trainer.contract import (
    TrainModel,
    build_model,
    dense_parameters,
    embedding_modules,
)

if TYPE_CHECKING:
    from airflow_ett.trainer.config import TrainerConfig

__all__ = ["TrainModel", "build_for", "shard"]


def build_for(cfg: TrainerConfig, *, device: torch.device | None = None,
              world_size: int = 1) -> TrainModel:
    """The job's model, unsharded, on `device` (CPU by default), initialised from
    `cfg.seed` alone so that every attempt and every rank starts from the same weights."""
    require_torchrec()
    return build_model(cfg.model, cfg.data.schema, device=device or torch.device("cpu"),
                       seed=cfg.seed, batch_size=cfg.batch_size, world_size=world_size)


def single_process(cfg: TrainerConfig, built: TrainModel
                   ) -> tuple[nn.Module, dict[str, torch.optim.Optimizer]]:
    return built.module, {"all": torch.optim.Adagrad(built.module.parameters(), lr=cfg.lr_dense)}


def shard(cfg: TrainerConfig, built: TrainModel, device: torch.device
          ) -> tuple[nn.Module, dict[str, torch.optim.Optimizer]]:
    """DistributedModelParallel with fused RowWiseAdagrad on the tables (applied in
    backward, before sharding) and plain Adagrad on the dense parameters."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    module = built.module
    tables = [p for _, m in embedding_modules(module) for p in m.parameters()]
    # torchrec mutates the kwargs dict it is given: a fresh one each time
    apply_optimizer_in_backward(RowWiseAdagrad, tables, {"lr": cfg.lr_sparse})
    model = DistributedModelParallel(
        module=module, device=device, env=ShardingEnv.from_process_group(dist.group.WORLD))
    dense = KeyedOptimizerWrapper(
        dense_parameters(model), lambda params: torch.optim.Adagrad(params, lr=cfg.lr_dense))
    return model, {"dense": dense, "sparse": CombinedOptimizer([model.fused_optimizer])}
