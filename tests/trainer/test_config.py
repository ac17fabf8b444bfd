"""Trainer config: a typo fails at load, naming the field and the value."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.trainer.config import (
    DAY_S,
    MAX_ATTEMPT,
    MAX_BATCH_SIZE,
    MAX_DURATION_S,
    MAX_KEEP_LAST,
    MAX_LR,
    MAX_NUM_WORKERS,
    MAX_PREFETCH,
    MAX_SLEEP_S,
    MAX_STEPS,
    ConfigError,
    FaultSpec,
    config_from_mapping,
    load_config,
)
from airflow_ett.trainer.model_config import BUNDLED, ModelConfig, ModelConfigError
from airflow_ett.trainer.readers import show
from tests.hostile import HOSTILE_JSON, deep_toml, in_thread

BASE = {"model": "dlrm_tiny", "steps": 10, "checkpoint_dir": "ckpt"}


def test_toml_file_with_defaults_and_relative_paths(tmp_path: Path) -> None:
    file = tmp_path / "job.toml"
    file.write_text(
        'model = "dlrm_small"\nsteps = 100\ncheckpoint_dir = "ckpt"\n'
        'checkpoint_interval = "auto"\n'
        '[optimizations]\nfast_batch = false\n'
        '[[faults]]\nkind = "raise"\nat_step = 30\nattempt = 1\n'
        '[[faults]]\nkind = "slow_save"\nat_step = 40\n'
        '[[faults]]\nkind = "slow_save"\nat_step = 50\nseconds = 2.5\n'
    )
    cfg = load_config(file)
    small = BUNDLED["dlrm_small"]
    assert cfg.model.name == "dlrm_small"
    assert cfg.model.config == {"embedding_dim": 16, "dense_arch": [128, 64, 16],
                                "over_arch": [128, 64, 1]}
    assert cfg.data.schema.tables == small.tables and cfg.data.format == "synthetic"
    assert cfg.checkpoint_dir == tmp_path / "ckpt"
    assert cfg.checkpoint_interval == "auto"
    assert cfg.optimizations.fast_batch is False and cfg.optimizations.parallel_init is True
    assert cfg.faults == (FaultSpec("raise", 30, 1), FaultSpec("slow_save", 40, None, 20.0),
                          FaultSpec("slow_save", 50, None, 2.5))
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
    with pytest.raises(ConfigError, match=r"^trainer config .*nope\.toml: not found$"):
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
        ({"tables": (("a", 2**40 + 1),)},
         "tables[a] = 1099511627777: num_embeddings must be > 0 and <= 1099511627776"),
        ({"embedding_dim": 2**16 + 1}, "embedding_dim = 65537: must be >= 1 and <= 65536"),
        ({"dense_arch": (2**20 + 1, 8)}, "dense_arch[0] = 1048577: must be >= 1 and <= 1048576"),
        ({"over_arch": (1,) * 4097}, "over_arch = '4097 layers': must be at most 4096 layers"),
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


MODEL = BUNDLED["dlrm_tiny"].to_dict()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # issue 8: a value of the wrong type is refused by name, never converted
        ({"compile": "no"}, "compile = 'no': must be true or false"),
        ({"compile": 0}, "compile = 0: must be true or false"),
        ({"grace_s": float("inf")}, "grace_s = inf: must be a finite number > 0"),
        ({"log_every_s": float("nan")}, "log_every_s = nan: must be a finite number > 0"),
        ({"step_sleep_s": float("nan")}, "step_sleep_s = nan: must be a finite number"),
        ({"data_startup_latency_s": -1}, "data_startup_latency_s = -1: must be >= 0"),
        ({"hang_timeout_s": float("inf")}, "hang_timeout_s = inf: must be a finite number"),
        ({"num_workers": 1.5}, "num_workers = 1.5: must be an integer"),
        ({"prefetch": 2.0}, "prefetch = 2.0: must be an integer"),
        ({"keep_last": False}, "keep_last = False: must be an integer"),
        ({"seed": -1}, "seed = -1: must be >= 0"),
        ({"checkpoint_interval": "infs"}, "checkpoint_interval = 'infs'"),
        ({"checkpoint_interval": "nans"}, "checkpoint_interval = 'nans'"),
        ({"checkpoint_interval": 2.5}, "checkpoint_interval = 2.5"),
        ({"faults": "kill"}, "faults = 'kill': must be a list"),
        ({"faults": {"kind": "kill", "at_step": 1}}, "faults = {'kind': 'kill'"),
        ({"faults": [{"kind": "kill", "at_step": 2.7}]}, "faults[0].at_step = 2.7"),
        ({"faults": [{"kind": "kill", "at_step": 2, "attempt": True}]},
         "faults[0].attempt = True: must be an integer"),
        ({"faults": [{"kind": "kill", "at_step": 2, "attemp": 1}]}, "unknown key(s) ['attemp']"),
        ({"faults": [{"kind": "kill", "at_step": 2, "seconds": 5}]},
         "faults[0].seconds = 5: is for a 'slow_save' or 'slow_steps' fault only, not 'kill'"),
        ({"faults": [{"kind": "slow_save", "at_step": 2, "seconds": -1}]},
         "faults[0].seconds = -1: must be >= 0"),
        ({"faults": [{"kind": "slow_steps", "at_step": 2}]},
         "faults[0].seconds = None: a 'slow_steps' fault needs the seconds"),
        ({"faults": [{"kind": "slow_steps", "at_step": 2, "seconds": 7200}]},
         "faults[0].seconds = 7200: must be >= 0.0 and <= 3600.0"),
        ({"rank_report_s": 0}, "rank_report_s = 0: must be > 0 and <= 86400.0"),
        ({"faults": [{"kind": "kill", "at_step": 2}, {"kind": "raise", "at_step": 2}]},
         "faults[1] = {'kind': 'raise', 'at_step': 2}: same at_step and attempt as faults[0]"),
        ({"optimizations": ["fast_batch"]}, "optimizations = ['fast_batch']: must be a table"),
        ({"optimizations": {"async_checkpoint": 1}}, "optimizations.async_checkpoint = 1"),
        ({"checkpoint_dir": ""}, "checkpoint_dir = '': must be a path"),
        ({"events_file": 3}, "events_file = 3: must be a path"),
        ({"model": 5}, "model = 5: must be a bundled model's name"),
        # model tables, read without int()/str()/tuple() coercion
        ({"model": MODEL | {"num_dense": 8.9}}, "num_dense = 8.9: must be an integer"),
        ({"model": MODEL | {"embedding_dim": "8"}}, "embedding_dim = '8': must be an integer"),
        ({"model": MODEL | {"tables": "abc"}}, "tables = 'abc': must be a list"),
        ({"model": MODEL | {"tables": [["a", 10.5]]}}, "tables[0] num_embeddings = 10.5"),
        ({"model": MODEL | {"tables": [["a", 10, 3]]}}, "tables[0] = ['a', 10, 3]: must be a pair"),
        ({"model": MODEL | {"tables": [[1, 10]]}}, "tables[0] name = 1: must be a string"),
        ({"model": MODEL | {"dense_arch": [0, 8]}}, "dense_arch[0] = 0: must be >= 1"),
        ({"model": MODEL | {"over_arch": "32,1"}}, "over_arch = '32,1': must be a list"),
        ({"model": MODEL | {"ids_per_feature": True}}, "ids_per_feature = True"),
        ({"model": MODEL | {"extra": ["x"]}}, "extra = ['x']: must be a mapping"),
        ({"model": MODEL | {"name": 7}}, "name = 7: must be a string"),
        ({"model": ["dlrm_tiny"]}, "model = ['dlrm_tiny']: must be a bundled model's name"),
    ],
)
def test_no_silent_coercion_each_mistake_in_one_line(changes: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(BASE | changes)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_model_built_in_python_is_type_checked_too() -> None:
    with pytest.raises(ModelConfigError, match=r"num_dense = 8.9: must be an integer"):
        ModelConfig(name="m", num_dense=8.9, embedding_dim=8,  # type: ignore[arg-type]
                    tables=(("a", 10),), dense_arch=(8,), over_arch=(1,))


def test_toml_nan_and_inf_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "job.toml"
    file.write_text('model = "dlrm_tiny"\nsteps = 3\ncheckpoint_dir = "c"\nlr_dense = nan\n')
    with pytest.raises(ConfigError, match="lr_dense = nan: must be a finite number > 0"):
        load_config(file)


def test_model_identity_follows_shapes_not_runtime_knobs() -> None:
    tiny = BUNDLED["dlrm_tiny"]

    def identity(model: object) -> str:
        return config_from_mapping({"model": model, "steps": 1,
                                    "checkpoint_dir": "c"}).model_identity

    same_shapes = tiny.to_dict() | {"ids_per_feature": 5}
    bigger = tiny.to_dict() | {"tables": [["cat_0", 1001]]}
    assert identity(same_shapes) == identity("dlrm_tiny")
    assert identity(bigger) != identity("dlrm_tiny")
    assert identity("dlrm_small") != identity("dlrm_tiny")


# --- every number has a plausible range (docs/decisions/0023) -----------------------------

OUT_OF_RANGE = [
    ({"steps": 10**9 + 1}, "steps = 1000000001: must be >= 1 and <= 1000000000"),
    ({"batch_size": 2**20 + 1}, "batch_size = 1048577: must be >= 1 and <= 1048576"),
    ({"lr_dense": 1e308}, "lr_dense = 1e+308: must be > 0 and <= 100.0"),
    ({"lr_sparse": 100.5}, "lr_sparse = 100.5: must be > 0 and <= 100.0"),
    ({"num_workers": 100_000}, "num_workers = 100000: must be >= 0 and <= 256"),
    ({"prefetch": 1025}, "prefetch = 1025: must be >= 1 and <= 1024"),
    ({"data_startup_latency_s": 1e308},
     "data_startup_latency_s = 1e+308: must be >= 0 and <= 3600.0"),
    ({"step_sleep_s": 1e308}, "step_sleep_s = 1e+308: must be >= 0 and <= 3600.0"),
    ({"step_sleep_s": 3600.5}, "step_sleep_s = 3600.5: must be >= 0 and <= 3600.0"),
    ({"keep_last": 1001}, "keep_last = 1001: must be >= 1 and <= 1000"),
    ({"grace_s": 1e308}, "grace_s = 1e+308: must be > 0 and <= 86400.0"),
    ({"log_every_s": 86401}, "log_every_s = 86401: must be > 0 and <= 86400.0"),
    ({"hang_timeout_s": 1e308}, "hang_timeout_s = 1e+308: must be > 0 and <= 86400.0"),
    ({"seed": 2**63}, "seed = 9223372036854775808: must be >= 0 and <= 9223372036854775807"),
    ({"checkpoint_interval": 10**9 + 1},
     "checkpoint_interval = 1000000001: steps must be > 0 and <= 1000000000"),
    ({"checkpoint_interval": "86401s"},
     "checkpoint_interval = '86401s': seconds must be <= 86400"),
    ({"checkpoint_interval": "1e308s"},
     "checkpoint_interval = '1e308s': seconds must be <= 86400"),
    ({"faults": [{"kind": "raise", "at_step": 11}]},
     "faults[0].at_step = 11: must be at most steps (10): the job never reaches it"),
    ({"faults": [{"kind": "raise", "at_step": 10**12}]},
     "faults[0].at_step = 1000000000000: must be >= 1 and <= 1000000000"),
    ({"faults": [{"kind": "slow_save", "at_step": 10}]},
     "faults[0].at_step = 10: must be below steps (10): no periodic save is made at the "
     "last step"),
    ({"faults": [{"kind": "kill", "at_step": 2, "attempt": 10_001}]},
     "faults[0].attempt = 10001: must be >= 1 and <= 10000"),
    ({"faults": [{"kind": "slow_save", "at_step": 2, "seconds": 1e308}]},
     "faults[0].seconds = 1e+308: must be >= 0.0 and <= 86400.0"),
    ({"faults": [{"kind": "kill", "at_step": 2, "rank": 2**20}]},
     "faults[0].rank = 1048576: must be >= 0 and <= 1048575"),
    ({"model": MODEL | {"num_dense": 2**16 + 1}},
     "num_dense = 65537: must be >= 1 and <= 65536"),
    ({"model": MODEL | {"embedding_dim": 2**16 + 1}},
     "embedding_dim = 65537: must be >= 1 and <= 65536"),
    ({"model": MODEL | {"ids_per_feature": 2**16 + 1}},
     "ids_per_feature = 65537: must be >= 1 and <= 65536"),
    ({"model": MODEL | {"tables": [["a", 2**40 + 1]]}},
     "tables[0] num_embeddings = 1099511627777: must be >= 1 and <= 1099511627776"),
    ({"model": MODEL | {"dense_arch": [2**20 + 1, 8]}},
     "dense_arch[0] = 1048577: must be >= 1 and <= 1048576"),
    ({"model": MODEL | {"tables": [[f"t{i}", 1] for i in range(4097)]}},
     "tables = '4097 tables': must be at most 4096 tables"),
]


@pytest.mark.parametrize(("changes", "message"), OUT_OF_RANGE)
def test_a_number_out_of_its_range_is_one_line_naming_field_and_value(
        changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(BASE | changes)
    assert str(info.value).endswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_the_ends_of_each_range_are_accepted() -> None:
    top = config_from_mapping(BASE | {
        "steps": MAX_STEPS, "batch_size": MAX_BATCH_SIZE, "lr_dense": MAX_LR,
        "num_workers": MAX_NUM_WORKERS, "prefetch": MAX_PREFETCH,
        "data_startup_latency_s": MAX_SLEEP_S, "step_sleep_s": MAX_SLEEP_S,
        "keep_last": MAX_KEEP_LAST, "grace_s": MAX_DURATION_S, "hang_timeout_s": DAY_S,
        "checkpoint_interval": "86400s",
        "faults": [{"kind": "raise", "at_step": MAX_STEPS, "attempt": MAX_ATTEMPT},
                   {"kind": "slow_save", "at_step": MAX_STEPS - 1, "seconds": DAY_S}]})
    assert (top.steps, top.num_workers, top.faults[0].at_step) == (MAX_STEPS, 256, MAX_STEPS)
    low = config_from_mapping(BASE | {"num_workers": 0, "step_sleep_s": 0,
                                      "faults": [{"kind": "raise", "at_step": 10}]})
    assert (low.num_workers, low.faults[0].at_step) == (0, 10)


#: Each top-level number: (lowest, highest, whole, lowest excluded).
NUMBER_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "steps": (1, MAX_STEPS, True, False),
    "batch_size": (1, MAX_BATCH_SIZE, True, False),
    "lr_dense": (0, MAX_LR, False, True),
    "lr_sparse": (0, MAX_LR, False, True),
    "num_workers": (0, MAX_NUM_WORKERS, True, False),
    "prefetch": (1, MAX_PREFETCH, True, False),
    "keep_last": (1, MAX_KEEP_LAST, True, False),
    "data_startup_latency_s": (0, MAX_SLEEP_S, False, False),
    "step_sleep_s": (0, MAX_SLEEP_S, False, False),
    "grace_s": (0, MAX_DURATION_S, False, True),
    "log_every_s": (0, MAX_DURATION_S, False, True),
    "hang_timeout_s": (0, MAX_DURATION_S, False, True),
}


def _inside(lo: float, hi: float, whole: bool, open_lo: bool) -> st.SearchStrategy[Any]:
    ints = st.integers(int(lo) + open_lo, int(hi))
    return ints if whole else st.one_of(ints, st.floats(lo, hi, exclude_min=open_lo))


def _outside(lo: float, hi: float, whole: bool, open_lo: bool) -> st.SearchStrategy[Any]:
    odd: list[st.SearchStrategy[Any]] = [
        st.integers(max_value=int(lo) - 1 + open_lo), st.integers(min_value=int(hi) + 1),
        st.floats(max_value=lo, exclude_max=not open_lo), st.floats(min_value=hi,
                                                                    exclude_min=True),
        st.sampled_from([math.nan, math.inf, -math.inf]), st.booleans()]
    if whole:
        odd.append(st.floats())
    return st.one_of(*odd)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(NUMBER_RANGES)))
def test_any_number_in_its_range_is_accepted_as_given(data: st.DataObject, name: str) -> None:
    value = data.draw(_inside(*NUMBER_RANGES[name]), label=name)
    assert getattr(config_from_mapping(BASE | {"steps": 10**6, name: value}), name) == value


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(NUMBER_RANGES)))
def test_any_number_out_of_its_range_is_refused_naming_field_and_value(
        data: st.DataObject, name: str) -> None:
    value = data.draw(_outside(*NUMBER_RANGES[name]), label=name)
    with pytest.raises(ConfigError) as info:
        config_from_mapping(BASE | {name: value})
    assert str(info.value).startswith(f"trainer config: {name} = {show(value)}: must be")


@pytest.mark.parametrize(("kind", "make"), [*HOSTILE_JSON, ("deep_toml", deep_toml)])
def test_a_hostile_config_file_is_a_config_error(tmp_path: Path, kind: str, make: Any) -> None:
    """Read bounded: a FIFO or /dev/zero (hung), 200 MB, not UTF-8 or 5,000 deep (a
    traceback and exit 1): one `ConfigError` line naming the file (the CLI's exit 78)."""
    config = tmp_path / ("job.toml" if kind == "deep_toml" else "job.json")
    says = make(config)
    with pytest.raises(ConfigError) as info:
        in_thread(lambda: load_config(config))
    assert str(info.value).startswith(f"trainer config {config}: {says}"), info.value


def test_the_trainer_file_its_writer_writes_is_what_load_config_reads(tmp_path: Path) -> None:
    """`<job>/trainer.json`: `trainer_file_bytes` (the operators' one writer) and
    `load_config` (the trainer's one reader) agree on every field; `ConfigTable` names
    exactly the fields the reader accepts."""
    from dataclasses import fields

    from airflow_ett.trainer.config import (
        REQUIRED_FIELDS,
        ConfigTable,
        TrainerConfig,
        TrainerFile,
        trainer_file_bytes,
    )

    assert set(ConfigTable.__annotations__) == (
        {f.name for f in fields(TrainerConfig)} | {"model_config", "model_code_path"})
    assert set(REQUIRED_FIELDS) <= set(TrainerFile.__annotations__)
    table: TrainerFile = {
        "model": "dlrm_tiny", "steps": 12, "checkpoint_dir": str(tmp_path / "ckpt"),
        "compile_cache_dir": str(tmp_path / "cc"), "seed": 7, "checkpoint_interval": "30s",
        "faults": [{"kind": "slow_save", "at_step": 3, "attempt": 1, "seconds": 2.5}],
        "optimizations": {"warm_standby": False}, "hang_timeout_s": None,
    }
    data = trainer_file_bytes(table)
    assert json.loads(data) == table and data.endswith(b"}\n")
    (tmp_path / "trainer.json").write_bytes(data)
    cfg = load_config(tmp_path / "trainer.json")
    assert cfg == config_from_mapping(table)
    assert (cfg.steps, cfg.seed, cfg.checkpoint_interval) == (12, 7, "30s")
    assert cfg.faults == (FaultSpec("slow_save", 3, 1, 2.5, None),)
    assert cfg.optimizations.warm_standby is False and cfg.optimizations.fast_batch is True
    assert cfg.compile_cache_dir == tmp_path / "cc"
