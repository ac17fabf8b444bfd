"""The DLRM recommendation model the reference trainer trains, built with TorchRec.

One process: a plain `torchrec.models.dlrm.DLRM` with an unsharded
`EmbeddingBagCollection`, trained by one torch optimizer over every parameter. Several
processes: the same module wrapped in `DistributedModelParallel`, which shards the tables
(gloo on CPU, NCCL on GPU); the tables then get a *fused* optimizer applied in backward
and the dense parameters a plain one. That split is forced by facts measured on this
machine (issue 3): the planner picks fused kernels, so a plain optimizer over
`model.parameters()` never updates sharded tables, and DCP cannot place a plain
optimizer's state for model-parallel tables.

Only the dense part (dense arch, interaction, over arch) is compiled: `torch.compile` of
the whole DMP model runs but breaks into 16 graphs (KJT and distributed ops), while the
dense arches compile with none. `nn.Module.compile()` compiles in place, so state-dict
keys (and so checkpoints) are the same with and without compilation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from airflow_ett.trainer import require_torchrec
from airflow_ett.trainer.model_config import (
    BUNDLED,
    ModelConfig,
    ModelConfigError,
    resolve_model_config,
)

__all__ = [
    "BUNDLED",
    "DENSE_PARTS",
    "DLRMTrainModule",
    "ModelConfig",
    "ModelConfigError",
    "build_dlrm",
    "compile_dense",
    "dense_modules",
    "resolve_model_config",
]


class DLRMTrainModule(nn.Module):
    """DLRM plus its loss, so that one forward gives what backward needs."""

    def __init__(self, dlrm: nn.Module) -> None:
        super().__init__()
        self.model = dlrm
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, dense: torch.Tensor, sparse: Any, labels: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(dense, sparse).squeeze(-1)
        return self.loss_fn(logits, labels), logits.detach()


def build_dlrm(config: ModelConfig, *, seed: int, device: torch.device | None = None,
               meta: bool = False) -> DLRMTrainModule:
    """The unsharded model, initialised from `seed` alone so that every attempt and
    every rank starts from the same weights. `meta=True` builds the tables on the meta
    device for DistributedModelParallel to materialise only its shards."""
    require_torchrec()
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    device = device or torch.device("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"t_{name}", embedding_dim=config.embedding_dim,
                                   num_embeddings=rows, feature_names=[name])
                for name, rows in config.tables
            ],
            device=torch.device("meta") if meta else device,
        )
        dlrm = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=config.num_dense,
            dense_arch_layer_sizes=list(config.dense_arch),
            over_arch_layer_sizes=list(config.over_arch),
            dense_device=device,
        )
    return DLRMTrainModule(dlrm)


def dense_modules(train_module: nn.Module) -> Iterable[nn.Module]:
    """The parts worth compiling: everything but the embedding lookup."""
    inner: Any = getattr(train_module, "module", train_module)  # unwrap DMP
    dlrm: Any = inner.model
    modules: tuple[nn.Module, nn.Module, nn.Module] = (
        dlrm.dense_arch, dlrm.inter_arch, dlrm.over_arch)
    return modules


#: Names of `dense_modules`' parts, in order: the keys of their precompiled forwards.
DENSE_PARTS = ("dense_arch", "inter_arch", "over_arch")


def compile_dense(train_module: nn.Module, *, dynamic: bool = False) -> None:
    """Compile the dense arches in place (state-dict keys unchanged). Shapes are fixed
    by the data pipeline (fixed bag length, fixed batch), so `dynamic=False` avoids
    dynamic-shape guards; a last partial batch is never produced.

    With a compile cache activated in this process (`CompileCache.activate`), each part
    is compiled ahead of time, or loaded from the entry without a dynamo trace
    (`CompileCache.precompile`); without one, `nn.Module.compile` as torch does it."""
    from airflow_ett.trainer.compile_cache import active_cache

    cache = active_cache()
    for name, module in zip(DENSE_PARTS, dense_modules(train_module), strict=True):
        if cache is not None:
            cache.precompile(module, name, dynamic=dynamic)
        else:
            module.compile(dynamic=dynamic)
