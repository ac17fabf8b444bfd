"""The DAG files shipped in dags/ parse, and the adapters' examples stay short: each is
a `training_job(command=...)` of under 25 lines of user code."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_ett.operators import CommandTrainOperator

DAGS = Path(__file__).resolve().parents[1] / "dags"
ADAPTER_EXAMPLES = ["ett_loop_example.py", "ett_torchrec_pipeline_example.py",
                    "ett_lightning_example.py", "ett_hf_example.py"]


def _code_lines(path: Path) -> int:
    """Lines of code, the module docstring and blank lines left out."""
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree, clean=False)
    body = tree.body[1:] if doc is not None else tree.body
    first = body[0].lineno if body else 1
    lines = path.read_text().splitlines()[first - 1:]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


@pytest.mark.parametrize("name", sorted(p.name for p in DAGS.glob("*.py")))
def test_every_shipped_dag_file_parses(name: str) -> None:
    found = [v for v in runpy.run_path(str(DAGS / name)).values() if isinstance(v, DAG)]
    assert found, f"{name} defines no DAG"


@pytest.mark.parametrize("name", ADAPTER_EXAMPLES)
def test_an_adapter_example_is_a_short_command_job(name: str) -> None:
    (dag,) = [v for v in runpy.run_path(str(DAGS / name)).values() if isinstance(v, DAG)]
    (train,) = dag.tasks
    assert isinstance(train, CommandTrainOperator) and train.command is not None
    module = train.command[train.command.index("-m") + 1]
    assert module.startswith("airflow_ett.examples.")
    assert _code_lines(DAGS / name) < 25
