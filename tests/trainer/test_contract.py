"""The model contract, with real TorchRec modules: what a factory may return, what is
refused (one line), and that the compile warm-up updates nothing, even with the tables'
optimizer fused into backward as on a sharded job."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from airflow_ett.trainer.contract import (
    ModelContractError,
    TrainModel,
    build_model,
    dense_parameters,
    detached_embeddings,
    warm_compile,
)
from airflow_ett.trainer.data import fast_batch
from airflow_ett.trainer.files import file_source
from airflow_ett.trainer.model_spec import read_model_spec
from airflow_ett.trainer.schema import read_data_spec

DATA = read_data_spec({"format": "parquet", "paths": "/unused", "schema": {
    "label": "y", "dense": ["a", "b"], "sparse": {"u": 50, "i": 20}}})


def factory_module(tmp_path: Path, body: str) -> str:
    """An owner's module `owner_<n>.py` holding `body`; returns its factory path."""
    name = f"owner_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
        from torchrec.modules.mlp import MLP
        from airflow_ett.trainer.contract import TrainModel

        def tables(rows_u=50, rows_i=20, feature_u="u"):
            return EmbeddingBagCollection(tables=[
                EmbeddingBagConfig(name="t_u", embedding_dim=4, num_embeddings=rows_u,
                                   feature_names=[feature_u]),
                EmbeddingBagConfig(name="t_i", embedding_dim=4, num_embeddings=rows_i,
                                   feature_names=["i"])])

        class Tiny(nn.Module):
            def __init__(self, ebc):
                super().__init__()
                self.ebc, self.mlp = ebc, MLP(10, [8, 1])
            def forward(self, batch):
                pooled = self.ebc(batch.sparse_features).values()
                x = torch.cat([pooled, batch.dense_features], dim=1)
                logits = self.mlp(x).squeeze(-1)
                loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
                return loss, logits.detach()
    ''') + textwrap.dedent(body))
    return f"{name}:build"


def build(tmp_path: Path, body: str) -> TrainModel:
    spec = read_model_spec(factory_module(tmp_path, body), {"k": 1}, search=[tmp_path])
    return build_model(spec, DATA.schema, device=torch.device("cpu"), seed=3, batch_size=8)


GOOD = '''
def build(context):
    assert context.config == {"k": 1} and context.batch_size == 8
    return TrainModel(Tiny(tables()), compile=("mlp",))
'''


def test_a_factory_builds_the_same_weights_from_the_seed(tmp_path: Path) -> None:
    a, b = build(tmp_path, GOOD), build(tmp_path, GOOD)
    assert a.compile == ("mlp",)
    for (name, x), (_, y) in zip(a.module.state_dict().items(), b.module.state_dict().items(),
                                 strict=True):
        assert torch.equal(x, y), name
    assert set(dense_parameters(a.module)) == {n for n, _ in a.module.named_parameters()
                                                if not n.startswith("ebc.")}
    assert str(tmp_path) in sys.path  # the owner's folder, for the import


@pytest.mark.parametrize(("body", "says"), [
    ("def build(context):\n    return Tiny(tables())\n",
     "the factory returned Tiny, not a TrainModel"),
    ("def build(context):\n    return TrainModel(Tiny(tables()), compile=('nope',))\n",
     "TrainModel.compile names 'nope', which is not a submodule"),
    ("def build(context):\n    return TrainModel(Tiny(tables()), compile='mlp')\n",
     "TrainModel.compile = 'mlp': must be a tuple"),
    ("def build(context):\n    return TrainModel(Tiny(tables(feature_u='x')))\n",
     "table 't_u' reads feature 'x', not one of the data's sparse features ['i', 'u']"),
    ("def build(context):\n    return TrainModel(Tiny(tables(rows_u=10)))\n",
     "table 't_u' has 10 rows, but feature 'u' has ids up to 49"),
    ("def build(context):\n    raise KeyError('embedding_dim')\n",
     "the factory failed: KeyError: 'embedding_dim'"),
    ("import no_such_module_anywhere\ndef build(context):\n    pass\n",
     "failed: ModuleNotFoundError: No module named 'no_such_module_anywhere'"),
])
def test_a_broken_contract_is_one_line(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(ModelContractError) as caught:
        build(tmp_path, body)
    assert says in str(caught.value) and str(caught.value).startswith("model = 'owner_")


def test_the_warm_up_compiles_updates_nothing_and_reaches_no_table(tmp_path: Path) -> None:
    """No backward of the warm-up reaches a table: on a sharded job the tables' optimizer
    is fused into backward (it would step on the fast batch's zeros); here, unsharded,
    that shows as no gradient on any table while the dense parts get theirs."""
    built = build(tmp_path, GOOD)
    model = built.module
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = fast_batch(file_source(DATA, 8)).model_input()
    warm_compile(model, built.compile, batch)
    for name, value in model.state_dict().items():
        assert torch.equal(before[name], value), f"{name} changed in the warm-up"
    assert all(p.grad is None for p in model.parameters())
    with detached_embeddings(model):
        model(batch)[0].backward()
    assert all(p.grad is None for p in model.ebc.parameters())
    assert all(p.grad is not None for p in model.mlp.parameters())
    model.zero_grad(set_to_none=True)
    model(batch)[0].backward()  # outside it, training's backward reaches the tables
    assert all(p.grad is not None for p in model.ebc.parameters())
