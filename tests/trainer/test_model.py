"""The bundled DLRM, built through the model contract: from the config and seed alone
(same seed, same weights), trains, and compiles in place."""

from __future__ import annotations

from pathlib import Path

import torch

from airflow_ett.trainer.config import TrainerConfig, config_from_mapping
from airflow_ett.trainer.contract import compile_parts
from airflow_ett.trainer.data import make_batch
from airflow_ett.trainer.data_gen import ClickLogSpec
from airflow_ett.trainer.model import build_for


def tiny(tmp_path: Path, seed: int = 7) -> TrainerConfig:
    return config_from_mapping({"model": "dlrm_tiny", "steps": 1, "seed": seed,
                                "checkpoint_dir": str(tmp_path), "batch_size": 16})


def test_same_seed_same_weights_and_a_step_lowers_the_loss(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    a, b = build_for(cfg).module, build_for(cfg).module
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(next(iter(build_for(tiny(tmp_path, seed=8)).module.parameters())),
                           next(iter(a.parameters())))
    schema = cfg.data.schema
    spec = ClickLogSpec(seed=1, num_dense=schema.num_dense, tables=schema.tables,
                        ids_per_feature=cfg.data.ids_per_feature, batch_size=16)
    batch = make_batch(spec, 0).model_input()
    opt = torch.optim.Adagrad(a.parameters(), lr=0.1)
    first, _ = a(batch)
    for _ in range(20):
        loss, logits = a(batch)
        assert logits.shape == (16,)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < float(first)


def test_compile_in_place_keeps_state_dict_keys(tmp_path: Path) -> None:
    built = build_for(tiny(tmp_path))
    keys = list(built.module.state_dict())
    compile_parts(built.module, built.compile)
    assert list(built.module.state_dict()) == keys
