"""A two-tower ranking model, written as a model owner writes one for airflow-ett.

Nothing here is airflow-ett's own machinery: TorchRec tables and torch modules, and one
factory of the model contract (`airflow_ett.trainer.contract`). Point a lifecycle DAG at
it with `model="airflow_ett.examples.two_tower:build"` (or copy it next to your DAG and
name your copy).

The user tower reads the user's sparse features (pooled embeddings) and the dense
features; the item tower the item's sparse features; the logit is the dot product of
the two towers' vectors plus a bias. Config (every key optional):

    embedding_dim   16           the tables' width
    tower           [64, 32]     each tower's MLP layer sizes (the last is the vector)
    user_features   [...]        the sparse features of the user tower (default: the
                                 first half of the data's features)
    item_features   [...]        of the item tower (default: the rest)
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP

from airflow_ett.trainer.contract import ModelContext, TrainModel
from airflow_ett.trainer.readers import Reader


class TwoTower(nn.Module):
    """`forward(batch) -> (loss, logits)`: the model contract's convention."""

    def __init__(self, tables: EmbeddingBagCollection, user: list[str], item: list[str],
                 num_dense: int, dim: int, tower: list[int]) -> None:
        super().__init__()
        self.tables = tables
        self.user, self.item = user, item
        self.user_tower = MLP(len(user) * dim + num_dense, tower)
        self.item_tower = MLP(len(item) * dim, tower)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.tables(batch.sparse_features).to_dict()
        user = torch.cat([pooled[f] for f in self.user] + [batch.dense_features], dim=1)
        item = torch.cat([pooled[f] for f in self.item], dim=1)
        logits = (self.user_tower(user) * self.item_tower(item)).sum(dim=1) + self.bias
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, logits.detach()


def build(context: ModelContext) -> TrainModel:
    """The factory airflow-ett calls: tables from the data schema, the rest from config."""
    config = context.config  # the table as written: check each value read from it
    r = Reader("two_tower model_config", ValueError)
    features = [f.name for f in context.schema.sparse]
    half = max(1, len(features) // 2)
    user = list(r.strings("user_features", config.get("user_features", features[:half])))
    item = list(r.strings("item_features",
                          config.get("item_features", features[half:] or features[:1])))
    unknown = sorted(set(user + item) - set(features))
    if unknown:
        raise ValueError(f"user_features/item_features name {unknown}, not features of the "
                         f"data ({features})")
    dim = r.integer("embedding_dim", config.get("embedding_dim", 16), minimum=1)
    tower = [r.integer(f"tower[{i}]", x, minimum=1)
             for i, x in enumerate(r.sequence("tower", config.get("tower", [64, 32]), min_len=1))]
    tables = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t_{f.name}", embedding_dim=dim,
                                   num_embeddings=f.num_embeddings, feature_names=[f.name])
                for f in context.schema.sparse if f.name in set(user + item)],
        device=context.device,
    )
    model = TwoTower(tables, user, item, context.schema.num_dense, dim, tower)
    return TrainModel(model.to(context.device), compile=("user_tower", "item_tower"))
