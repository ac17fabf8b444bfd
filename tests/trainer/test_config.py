"""Trainer config: a typo fails at load, naming the field and the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ett.trainer.config import ConfigError, FaultSpec, config_from_mapping, load_config
from airflow_ett.trainer.model import BUNDLED, ModelConfig, ModelConfigError

BASE = {"model": "dlrm_tiny", "steps": 10, "checkpoint_dir": "ckpt"}


def test_toml_file_with_defaults_and_relative_paths(tmp_path: Path) -> None:
    file = tmp_path / "job.toml"
    file.write_text(
        'model = "dlrm_small"\nsteps = 100\ncheckpoint_dir = "ckpt"\n'
        'checkpoint_interval = "auto"\n'
        '[optimizations]\nfast_batch = false\n'
        '[[faults]]\nkind = "raise"\nat_step = 30\nattempt = 1\n'
    )
    cfg = load_config(file)
    assert cfg.model == BUNDLED["dlrm_small"]
    assert cfg.checkpoint_dir == tmp_path / "ckpt"
    assert cfg.checkpoint_interval == "auto"
    assert cfg.optimizations.fast_batch is False and cfg.optimizations.parallel_init is True
    assert cfg.faults == (FaultSpec("raise", 30, 1),)
    assert cfg.interval_steps() is None and cfg.interval_seconds() is None


def test_json_with_an_inline_model_and_interval_in_seconds(tmp_path: Path) -> None:
    model = BUNDLED["dlrm_tiny"].to_dict() | {"name": "mine"}
    file = tmp_path / "job.json"
    file.write_text(json.dumps(BASE | {"model": model, "checkpoint_interval": "30s"}))
    cfg = load_config(file)
    assert cfg.model.name == "mine"
    assert cfg.interval_seconds() == 30.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"steps": 0}, "steps = 0: must be >= 1"),
        ({"steps": "ten"}, "steps = 'ten': must be an integer"),
        ({"batch_size": True}, "batch_size = True: must be an integer"),
        ({"lr_dense": 0}, "lr_dense = 0: must be > 0"),
        ({"model": "dlrm_huge"}, "model = 'dlrm_huge': not a bundled model"),
        ({"checkpoint_interval": "often"}, "checkpoint_interval = 'often'"),
        ({"checkpoint_interval": -5}, "checkpoint_interval = -5: steps must be > 0"),
        ({"faults": [{"kind": "explode", "at_step": 3}]}, "faults[0].kind = 'explode'"),
        ({"faults": [{"kind": "kill", "at_step": 0}]}, "faults[0].at_step = 0"),
        ({"optimizations": {"fast_batch": "yes"}}, "optimizations.fast_batch = 'yes'"),
        ({"optimizations": {"turbo": True}}, "optimizations.turbo = True: unknown"),
        ({"stepz": 3}, "unknown field(s) ['stepz']"),
        ({"hang_timeout_s": 0}, "hang_timeout_s = 0: must be > 0"),
        ({"hang_timeout_s": "1m"}, "hang_timeout_s = '1m': must be a number"),
    ],
)
def test_bad_values_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(BASE | changes)
    assert message in str(info.value)


def test_missing_fields_and_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing required field 'checkpoint_dir'"):
        config_from_mapping({"model": "dlrm_tiny", "steps": 3})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dense_arch": (32, 16)}, "dense_arch = (32, 16): must end in embedding_dim (8)"),
        ({"over_arch": (32, 2)}, "over_arch = (32, 2): must end in 1"),
        ({"tables": ()}, "needs at least one table"),
        ({"tables": (("a", 10), ("a", 10))}, "table names must be unique"),
        ({"tables": (("a", 0),)}, "tables[a] = 0: num_embeddings must be > 0"),
    ],
)
def test_model_config_is_validated(changes: dict[str, object], message: str) -> None:
    fields = BUNDLED["dlrm_tiny"].to_dict() | changes
    fields["tables"] = tuple(tuple(t) for t in fields["tables"])
    fields["dense_arch"] = tuple(fields["dense_arch"])
    fields["over_arch"] = tuple(fields["over_arch"])
    with pytest.raises(ModelConfigError) as info:
        ModelConfig(**fields)
    assert message in str(info.value)
