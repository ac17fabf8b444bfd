"""The DLRM builds from its config alone (same seed, same weights) and trains."""

from __future__ import annotations

import torch

from airflow_ett.trainer.model import BUNDLED, ModelConfig, build_dlrm, compile_dense


def kjt(config: ModelConfig, batch: int) -> object:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    n = len(config.tables) * batch * config.ids_per_feature
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[name for name, _ in config.tables],
        values=torch.arange(n, dtype=torch.int64) % 100,
        lengths=torch.full((len(config.tables) * batch,), config.ids_per_feature,
                           dtype=torch.int32),
    )


def test_same_seed_same_weights_and_a_step_lowers_the_loss() -> None:
    config = BUNDLED["dlrm_tiny"]
    a, b = build_dlrm(config, seed=7), build_dlrm(config, seed=7)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(next(iter(build_dlrm(config, seed=8).parameters())),
                           next(iter(a.parameters())))
    dense = torch.randn(16, config.num_dense)
    labels = (torch.rand(16) > 0.5).float()
    sparse = kjt(config, 16)
    opt = torch.optim.Adagrad(a.parameters(), lr=0.1)
    first, _ = a(dense, sparse, labels)
    for _ in range(20):
        loss, logits = a(dense, sparse, labels)
        assert logits.shape == (16,)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < float(first)


def test_compile_in_place_keeps_state_dict_keys() -> None:
    config = BUNDLED["dlrm_tiny"]
    model = build_dlrm(config, seed=1)
    keys = list(model.state_dict())
    compile_dense(model)
    assert list(model.state_dict()) == keys
