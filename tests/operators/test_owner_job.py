"""`training_job(model="pkg.module:build", model_config=..., data=...)`: an owner's model
and files in a lifecycle DAG, resolved and checked when the DAG file is parsed (no
torch, no owner code run), and the trigger form's `data_paths` / `model_config`."""

from __future__ import annotations

import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.operators import JobConfigError
from airflow_ett.operators.job import job_paths, materialize

DAG = '''
from airflow_ett.operators import training_job

dag = training_job(
    "ranking_ctr_v7",
    model="ranking.towers:build",
    model_config={"embedding_dim": 8},
    data={"format": "criteo_tsv", "paths": "data/day_*.tsv",
          "schema": {"num_embeddings": 1000}},
    steps=10,
    **EXTRA,
)
'''


BAD_DAG = """
from airflow_ett.operators import training_job

base = {"model": "ranking.towers:build", "model_config": {"embedding_dim": 8},
        "data": {"format": "criteo_tsv", "paths": "data/*.tsv",
                 "schema": {"num_embeddings": 9}}}
dag = training_job("bad", steps=10, **{**base, **EXTRA})
"""


def dag_file(folder: Path, extra: str = "{}") -> Path:
    package = folder / "ranking"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "towers.py").write_text("import torch\n\ndef build(context):\n    pass\n")
    path = folder / "ranking_dag.py"
    path.write_text(textwrap.dedent(DAG).replace("**EXTRA", f"**{extra}"))
    return path


def parse(path: Path) -> Any:
    return runpy.run_path(str(path))["dag"]


def test_the_owner_job_is_resolved_beside_its_dag_file(tmp_path: Path) -> None:
    before = set(sys.modules)
    dag = parse(dag_file(tmp_path / "dags"))
    assert not {m for m in set(sys.modules) - before if m.startswith(("ranking", "torch."))}
    config = dag.get_task("train").trainer_config
    assert config["model"] == "ranking.towers:build"
    assert config["model_code_path"] == str((tmp_path / "dags").resolve())
    assert config["model_config"] == {"embedding_dim": 8}
    assert config["data"]["paths"] == [str(tmp_path / "dags" / "data" / "day_*.tsv")]
    assert config["data"]["schema"]["sparse"][0] == {
        "name": "cat_0", "column": "cat_0", "num_embeddings": 1000, "encoding": "hex",
        "max_ids": 1}
    assert "ett:model=towers" in dag.tags
    params = dag.params.dump()
    assert params["data_paths"] == config["data"]["paths"]
    assert params["model_config"] == {"embedding_dim": 8}

    # the form, per run: other files, another config; relative paths refused
    paths = job_paths(tmp_path / "work", "ranking_ctr_v7", "run1")
    cfg = materialize(config, {**params, "data_paths": ["/data/other/*.tsv"],
                               "model_config": {"embedding_dim": 16}}, paths)
    assert cfg.data.paths == ("/data/other/*.tsv",)
    assert cfg.model.config == {"embedding_dim": 16}
    assert cfg.model.code_path == (tmp_path / "dags").resolve()
    with pytest.raises(JobConfigError, match=r"DAG param 'data_paths'\[0\] = 'rel/\*.tsv': "
                                             "must be an absolute path"):
        materialize(config, {**params, "data_paths": ["rel/*.tsv"]}, paths)
    unchanged = materialize(config, params, paths)
    assert unchanged.data.paths == (str(tmp_path / "dags" / "data" / "day_*.tsv"),)


@pytest.mark.parametrize(("extra", "says"), [
    ('{"model": "ranking.towers:biuld"}', "towers.py defines no 'biuld' at its top level"),
    ('{"model": "ranking.tower:build"}', "cannot find module 'ranking.tower'"),
    ('{"model_config": {"f": float("inf")}}', "must hold JSON values only"),
    ('{"data": {"format": "tsv", "paths": "x"}}', "training_job: data: format = 'tsv'"),
    ('{"data": {"format": "parquet", "paths": "x", "schema": {"sparse": {"a": 1}}}}',
     "training_job: data: schema.dense = None: missing"),
    ('{"trainer_options": {"data": {}}}', "trainer_options ['data'] have their own parameters"),
])
def test_a_bad_model_or_data_fails_at_parse_time_in_one_line(tmp_path: Path, extra: str,
                                                             says: str) -> None:
    dag_file(tmp_path)
    bad = tmp_path / "bad_dag.py"
    bad.write_text(textwrap.dedent(BAD_DAG).replace("EXTRA", extra))
    with pytest.raises(JobConfigError) as caught:
        parse(bad)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_model_config_is_for_a_factory_and_bundled_models_keep_their_log(tmp_path: Path) -> None:
    from airflow_ett.operators import training_job

    with pytest.raises(JobConfigError, match=r"model_config = .*: is for a model given by "
                                             "import path"):
        training_job("j", model="dlrm_tiny", steps=3, model_config={"x": 1})
    dag = training_job("j", model="dlrm_tiny", steps=3)
    assert "data" not in dag.get_task("train").trainer_config
    assert "data_paths" not in dag.params.dump()
    # a bundled DLRM on an owner's files: the DLRM's tables come from the schema
    dag = training_job("j", model="dlrm_tiny", steps=3, data={
        "format": "parquet", "paths": str(tmp_path / "*.parquet"),
        "schema": {"dense": ["a"], "sparse": {"b": 7}}})
    assert dag.get_task("train").trainer_config["data"]["format"] == "parquet"


def test_parsing_the_dag_and_reading_files_import_no_torch(tmp_path: Path) -> None:
    """In a fresh interpreter: the DAG file parses (its model found, its data spec read)
    and the data workers' modules load without torch or the owner's code."""
    path = dag_file(tmp_path / "dags")
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent(f'''
        import runpy, sys
        runpy.run_path({str(path)!r})
        import airflow_ett.trainer.files, airflow_ett.trainer.encode
        import airflow_ett.trainer.data_gen, airflow_ett.trainer.data_workers
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ranking",
                                                                  "torchrec")))
    ''')], capture_output=True, text=True, timeout=120, check=False)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip().splitlines()[-1] == "[]"
