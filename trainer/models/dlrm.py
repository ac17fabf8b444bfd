"""The bundled DLRM (`torchrec.models.dlrm.DLRM`) as a factory of the model contract.

Its tables come from the data schema (one `EmbeddingBagCollection` table per sparse
feature, `num_embeddings` as declared there) and its dense input width from the schema's
dense columns; the config table gives the rest: `embedding_dim`, `dense_arch` (ending in
`embedding_dim`: the interaction is a dot product) and `over_arch` (ending in 1). The
bundled configs (`model_config.BUNDLED`) also carry the shapes of the synthetic log they
train on (`tables`, `num_dense`, `ids_per_feature`); those are the data's, read there.

Only the dense part (dense arch, interaction, over arch) is compiled: `torch.compile` of
the whole sharded model runs but breaks into 16 graphs (KJT and distributed ops), while
the dense arches compile with none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import torch
from torch import nn

from airflow_ett.trainer.contract import ModelContext, TrainModel
from airflow_ett.trainer.model_config import MAX_LAYER, MAX_WIDTH, ModelConfigError
from airflow_ett.trainer.readers import Reader

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

#: The parts compiled, as dotted submodule names of `DLRMTrain`.
DENSE_PARTS: Final = ("model.dense_arch", "model.inter_arch", "model.over_arch")
#: Keys of a DLRM config the factory reads, and those it leaves to the data.
_ARCH: Final = ("embedding_dim", "dense_arch", "over_arch")
_DATA_SHAPES: Final = ("name", "num_dense", "tables", "ids_per_feature", "extra")


class DLRMTrain(nn.Module):
    """DLRM plus its loss: `forward(batch) -> (loss, logits)`, TorchRec's convention."""

    def __init__(self, dlrm: nn.Module) -> None:
        super().__init__()
        self.model = dlrm
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        return self.loss_fn(logits, batch.labels), logits.detach()


def _arch(config: Mapping[str, object]) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    r = Reader("model_config", ModelConfigError)
    r.mapping("model_config", config, known=(*_ARCH, *_DATA_SHAPES))
    for key in _ARCH:
        if key not in config:
            raise r.fail(key, None, "missing (a DLRM needs embedding_dim, dense_arch, over_arch)")
    dim = r.integer("embedding_dim", config["embedding_dim"], minimum=1, maximum=MAX_WIDTH)
    dense = tuple(r.integer(f"dense_arch[{i}]", x, minimum=1, maximum=MAX_LAYER)
                  for i, x in enumerate(r.sequence("dense_arch", config["dense_arch"], min_len=1)))
    over = tuple(r.integer(f"over_arch[{i}]", x, minimum=1, maximum=MAX_LAYER)
                 for i, x in enumerate(r.sequence("over_arch", config["over_arch"], min_len=1)))
    if dense[-1] != dim:
        raise r.fail("dense_arch", list(dense), f"must end in embedding_dim ({dim})")
    if over[-1] != 1:
        raise r.fail("over_arch", list(over), "must end in 1 (one logit)")
    return dim, dense, over


def build(context: ModelContext) -> TrainModel:
    """A DLRM over the schema's features (module docstring)."""
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    dim, dense_arch, over_arch = _arch(context.config)
    if context.schema.num_dense < 1:
        raise ModelConfigError("DLRM needs at least one dense feature (schema.dense is empty)")
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t_{name}", embedding_dim=dim, num_embeddings=rows,
                                   feature_names=[name])
                for name, rows in context.schema.tables],
        device=context.device,
    )
    dlrm = DLRM(embedding_bag_collection=ebc, dense_in_features=context.schema.num_dense,
                dense_arch_layer_sizes=list(dense_arch), over_arch_layer_sizes=list(over_arch),
                dense_device=context.device)
    return TrainModel(DLRMTrain(dlrm), compile=DENSE_PARTS)
