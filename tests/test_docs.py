"""The examples in docs/events.md are real: parse and compute the first one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import parse_lines

DOC = Path(__file__).resolve().parents[1] / "docs" / "events.md"


def json_blocks() -> list[str]:
    return re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_documented_line_is_a_valid_event() -> None:
    blocks = json_blocks()
    # Counted independently of the regex, so a changed fence style cannot make the test
    # check nothing: every ```json fence in the doc is one checked block.
    fences = [line for line in DOC.read_text().splitlines() if line.strip() == "```json"]
    assert len(blocks) == len(fences) >= 2
    checked = 0
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        result = parse_lines(lines)
        assert result.errors == [], result.errors
        assert len(result.events) == len(lines)
        checked += len(result.events)
    assert checked >= 9  # at least the clean job (8 events) and the single-event example


def test_clean_job_example_gives_the_documented_figures() -> None:
    events = parse_lines(json_blocks()[0].splitlines()).events
    d = attribute_job(events).to_dict()
    assert d["e2e_s"] == 85.0
    assert round(d["ett_pct"], 1) == 70.6
    assert d["components"] == pytest.approx({
        "scheduling": 10.0, "initialization": 0.0, "compilation": 10.0,
        "effective_training": 60.0, "wasted_training": 0.0, "shutdown": 5.0,
    })
    assert d["phases"]["final_checkpoint"] == 2.0
    assert d["phases"]["shutdown_other"] == 3.0


def _owner_dags() -> list[str]:
    """The complete owner DAGs of README ("Bring your model and data") and
    docs/model-contract.md ("A complete DAG")."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    contract = (root / "docs" / "model-contract.md").read_text()
    out = []
    for text, heading in ((readme, "## Bring your model and data"),
                          (contract, "## A complete DAG")):
        section = text[text.index(heading):]
        out.append(re.findall(r"```python\n(.*?)```", section, flags=re.S)[0])
    return out


@pytest.mark.parametrize("source", _owner_dags(), ids=["README", "model-contract"])
def test_the_documented_owner_dag_is_complete_and_parses(source: str, tmp_path: Path) -> None:
    import runpy
    import shutil

    from airflow_ett.examples import two_tower

    assert len(source.strip().splitlines()) < 20
    (tmp_path / "ranking").mkdir()
    (tmp_path / "ranking" / "__init__.py").write_text("")
    shutil.copy(two_tower.__file__, tmp_path / "ranking" / "towers.py")
    (tmp_path / "owner_dag.py").write_text(source)
    dag = runpy.run_path(str(tmp_path / "owner_dag.py"))["dag"]
    config = dag.get_task("train").trainer_config
    assert config["model"] == "ranking.towers:build"
    assert config["model_code_path"] == str(tmp_path.resolve())
    assert config["data"]["format"] in ("parquet", "criteo_tsv")


def _trainer_dags() -> list[str]:
    """The command-job DAGs of README ("Bring your own trainer") and
    docs/trainer-protocol.md (its first example)."""
    root = Path(__file__).resolve().parents[1]
    out = []
    for text, heading in (((root / "README.md").read_text(), "## Bring your own trainer"),
                          ((root / "docs" / "trainer-protocol.md").read_text(), "# The")):
        section = text[text.index(heading):]
        out.append(re.findall(r"```python\n(.*?)```", section, flags=re.S)[0])
    return out


@pytest.mark.parametrize("source", _trainer_dags(), ids=["README", "trainer-protocol"])
def test_the_documented_command_dag_parses(source: str, tmp_path: Path) -> None:
    import runpy

    from airflow_ett.operators import CommandTrainOperator

    (tmp_path / "trainer_dag.py").write_text(source)
    dag = runpy.run_path(str(tmp_path / "trainer_dag.py"))["dag"]
    (train,) = dag.tasks
    assert isinstance(train, CommandTrainOperator)
    assert train.cwd == str(tmp_path.resolve()) and train.command is not None
