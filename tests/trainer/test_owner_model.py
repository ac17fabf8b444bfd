"""An owner's model on an owner's files, through the trainer as the operator runs it: the
bundled two-tower example (`airflow_ett.examples.two_tower`) over the generated Criteo
TSV and Parquet data, killed and resumed bitwise; sharded over two processes; and every
way the owner's code or data can be wrong is one line and exit 78."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import read_events
from airflow_ett.examples.make_data import NUM_EMBEDDINGS, make
from airflow_ett.protocol.exits import EXIT_BAD_CONFIG, EXIT_OK
from airflow_ett.trainer.config import load_config
from airflow_ett.trainer.final_state import load_final_state
from tests.trainer.test_trainer_e2e import launch_two, run_attempt, run_job, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TWO_TOWER = "airflow_ett.examples.two_tower:build"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("owner-data")
    make(out, rows=3000, files=2, seed=3, npy=False)
    return out


def assert_restored(log: str, steps: tuple[int, ...], *, per_step: int) -> None:
    """The resume restored one of `steps` (the newest save may still have been in flight
    when the attempt died: then the one before) at exactly its cursor."""
    found = re.findall(r"restored step (\d+) \(cursor (\d+)\)", log)
    assert found, log[-3000:]
    step, cursor = map(int, found[-1])
    assert step in steps and cursor == step * per_step, found


def owner_job(path: Path, data_dir: Path, fmt: str = "criteo_tsv", **fields: Any) -> Path:
    schema: dict[str, Any] = {"sparse": {f"cat_{i}": NUM_EMBEDDINGS[i] for i in range(8)}}
    pattern = "day_*.tsv"
    if fmt == "parquet":
        schema |= {"dense": [f"int_{i}" for i in range(13)], "encoding": "hex"}
        pattern = "day_*.parquet"
    job: dict[str, Any] = {
        "model": TWO_TOWER, "model_config": {"embedding_dim": 8, "tower": [16, 8]},
        "data": {"format": fmt, "paths": str(data_dir / pattern), "schema": schema},
        "steps": 40, "batch_size": 64, "checkpoint_interval": 10,
    }
    job.update(fields)
    return write_config(path, **job)


@pytest.mark.parametrize("fmt", ["criteo_tsv", "parquet"])
def test_killed_and_resumed_owner_model_ends_bitwise_equal_to_a_clean_run(
        tmp_path: Path, data: Path, fmt: str) -> None:
    clean = owner_job(tmp_path / "clean" / "job.json", data, fmt, num_workers=1)
    faulty = owner_job(tmp_path / "faulty" / "job.json", data, fmt, num_workers=2,
                       faults=[{"kind": "kill", "at_step": 25, "attempt": 1}])
    run_job(clean, "clean", [EXIT_OK])
    logs = run_job(faulty, "faulty", [-9, EXIT_OK])
    assert_restored(logs[-1], (10, 20), per_step=64)
    want = load_final_state(load_config(clean))
    got = load_final_state(load_config(faulty))
    assert want.keys() == got.keys() and "tables.embedding_bags.t_cat_0.weight" in want
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs after the restore"
    # 40 steps of 64 over 3000 rows: the cursor wrapped into the second epoch
    marker = json.loads(sorted((tmp_path / "faulty" / "ckpt").glob(
        "step-*/COMMITTED.json"))[-1].read_text())
    assert marker["extra"]["cursor"] == 40 * 64 and marker["extra"]["bad_rows"] == 0
    d = attribute_job(read_events(str(tmp_path / "faulty" / "events.jsonl")).events).to_dict()
    assert d["nof"]["total"] == 1 and d["attempts"][-1]["status"] == "success"
    for phase in ("model_creation", "data_pipeline_init", "checkpoint_restore"):
        assert phase in d["phases_raw"], phase


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(
    sys.executable).with_name("torchrun").exists(), reason="torchrun not installed")
def test_two_processes_shard_the_owner_model_and_resume(tmp_path: Path, data: Path) -> None:
    """DistributedModelParallel shards the owner's tables (row-wise Adagrad fused into
    backward), its towers compile on the fast batch (the sharded lookups detached), and
    the job resumes from its checkpoint at the exact cursor. A bad row in rank 1's share
    leaves its batch one row short (the sharded lookup takes unequal batches), and the
    job's count of bad rows is every rank's."""
    lines = (data / "day_0.tsv").read_bytes().splitlines(keepends=True)
    lines[70] = b"0\t1\t2\n"  # rank 1's rows of step 1 are 64..127
    (tmp_path / "day_0.tsv").write_bytes(b"".join(lines))
    config = owner_job(tmp_path / "job.json", data, steps=20, checkpoint_interval=5,
                       num_workers=0, compile=True, faults=[{"kind": "raise", "at_step": 12,
                                                              "attempt": 1}])
    job = json.loads(config.read_text())
    job["data"]["paths"] = [str(tmp_path / "day_0.tsv"), str(data / "day_1.tsv")]
    config.write_text(json.dumps(job))
    assert launch_two(config, 1).returncode != 0
    second = launch_two(config, 2)
    assert second.returncode == 0, second.stderr[-4000:]
    assert_restored(second.stderr, (5, 10), per_step=2 * 64)
    final = load_final_state(load_config(config))
    assert final["tables.embedding_bags.t_cat_0.weight"].shape == (NUM_EMBEDDINGS[0], 8)
    marker = json.loads(sorted((tmp_path / "ckpt").glob(
        "step-*/COMMITTED.json"))[-1].read_text())
    assert marker["extra"]["bad_rows"] == 1 and "row 71: 3 columns" in second.stderr


def one_line(done: subprocess.CompletedProcess[str], *says: str) -> str:
    assert done.returncode == EXIT_BAD_CONFIG, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "error" in line.lower()
             and "Traceback" not in line]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    joined = "\n".join(lines)
    for part in says:
        assert part in joined, joined
    return joined


def test_bad_model_and_data_are_one_line_and_exit_78(tmp_path: Path, data: Path) -> None:
    env = {"AIRFLOW__ETT__DISABLED": "True"}
    cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        ({"model": "airflow_ett.examples.two_tower:biuld"},
         ("model = 'airflow_ett.examples.two_tower:biuld'", "defines no 'biuld'")),
        ({"model": "no_such_pkg.model:build"}, ("cannot find module 'no_such_pkg.model'",)),
        ({"model_config": {"user_features": ["cat_99"]}},
         ("the factory failed", "cat_99")),
        ({"data": {"format": "criteo_tsv", "paths": str(tmp_path / "none*.tsv"),
                   "schema": {"num_embeddings": 10}}}, ("matches no file",)),
        ({"data": {"format": "criteo_tsv", "paths": str(data / "day_0.parquet"),
                   "schema": {"num_embeddings": 10}}}, ("day_0.parquet row 1",)),
        ({"data": {"format": "criteo_tsv", "paths": str(data / "day_*.tsv"),
                   "schema": {"sparse": {"cat_0": 10}, "dense": ["int_0", "nope"]}}},
         ("schema.dense[1] = 'nope'",)),
    ]
    for i, (change, says) in enumerate(cases):
        config = owner_job(tmp_path / f"case{i}" / "job.json", data, steps=2, **change)
        one_line(run_attempt(config, f"bad{i}", 1, env=env), *says)


def test_bad_rows_are_skipped_counted_and_past_the_limit_exit_78(tmp_path: Path,
                                                                data: Path) -> None:
    lines = (data / "day_0.tsv").read_bytes().splitlines(keepends=True)[:400]
    lines[5] = b"1\tnot-a-number" + lines[5][lines[5].index(b"\t", 2):]
    lines[70] = b"0\t1\t2\n"
    lines[130] = lines[130].rsplit(b"\t", 1)[0] + b"\tqqqqqqqq\n"  # not hex
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    (bad_dir / "part.tsv").write_bytes(b"".join(lines))
    data_spec = {"format": "criteo_tsv", "paths": str(bad_dir / "part.tsv"),
                 "schema": {"sparse": {f"cat_{i}": 100 for i in range(26)}}}
    env = {"AIRFLOW__ETT__DISABLED": "True"}
    config = owner_job(tmp_path / "ok" / "job.json", data, steps=4, num_workers=1,
                       data={**data_spec, "max_bad_rows": 3})
    done = run_attempt(config, "skips", 1, env=env)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "part.tsv row 6: column 'int_0': b'not-a-number' is not a number" in done.stderr
    assert "part.tsv row 71: 3 columns, the schema has 40" in done.stderr
    assert "part.tsv row 131: column 'cat_25'" in done.stderr
    marker = json.loads(sorted((tmp_path / "ok" / "ckpt").glob(
        "step-*/COMMITTED.json"))[-1].read_text())
    assert marker["extra"]["bad_rows"] == 3 and marker["extra"]["cursor"] == 4 * 64

    config = owner_job(tmp_path / "limit" / "job.json", data, steps=4, num_workers=1,
                       data={**data_spec, "max_bad_rows": 2})
    one_line(run_attempt(config, "limit", 1, env=env),
             "3 bad rows, more than max_bad_rows = 2", "part.tsv row 131")
