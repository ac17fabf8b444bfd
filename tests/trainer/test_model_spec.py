"""An owner's model named by import path: found without running it, checked for the
factory's name, hashed into an identity that changes with its code and config."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from airflow_ett.trainer.model_spec import ModelSpecError, read_model_spec

MODEL = textwrap.dedent('''
    raise RuntimeError("imported!")  # finding the factory must never run the module

    def build(context):
        return None
''')


#: The owner's package: a name no other test imports (an e2e test imports a "ranking").
PKG = f"ranking_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def owner(tmp_path: Path) -> Path:
    package = tmp_path / PKG
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('package imported!')\n")
    (package / "towers.py").write_text(MODEL)
    (package / "layers.py").write_text("WIDTH = 8\n")
    (package / "sub").mkdir()
    (package / "sub" / "deep.py").write_text("X = 1\n")
    return tmp_path


def test_found_beside_the_dag_without_running_it(owner: Path) -> None:
    factory = f"{PKG}.towers:build"
    spec = read_model_spec(factory, {"dim": 8}, search=[owner])
    assert (spec.name, spec.factory, spec.code_path) == ("towers", factory, owner.resolve())
    assert spec.config == {"dim": 8} and len(spec.code) == 16
    assert PKG not in sys.modules
    # the identity follows the code (the module and the modules beside it) and the config
    before = spec.identity("schema")
    assert read_model_spec(factory, {"dim": 8}, search=[owner]).identity(
        "schema") == before
    assert spec.identity("other schema") != before
    assert read_model_spec(factory, {"dim": 9}, search=[owner]).identity(
        "schema") != before
    (owner / PKG / "sub" / "deep.py").write_text("X = 2\n")  # below: not its code
    assert read_model_spec(factory, {"dim": 8}, search=[owner]).code == spec.code
    (owner / PKG / "layers.py").write_text("WIDTH = 16\n")  # beside it: its code
    assert read_model_spec(factory, {"dim": 8}, search=[owner]).code != spec.code


@pytest.mark.parametrize(("factory", "says"), [
    ("ranking.towers", "must be an import path 'package.module:function'"),
    ("ranking/towers.py:build", "must be an import path"),
    ("ranking.towers:build()", "must be an import path"),
    ("ranking.towerz:build", "cannot find module 'ranking_"),
    ("nowhere.towers:build", "cannot find module 'nowhere.towers': no module 'nowhere'"),
    ("ranking.towers:biuld", "towers.py defines no 'biuld' at its top level"),
    ("ranking.layers.x:build", ".layers' is a module, not a package"),
])
def test_a_bad_model_path_is_one_line(owner: Path, factory: str, says: str) -> None:
    factory = factory.replace("ranking", PKG)
    with pytest.raises(ModelSpecError) as caught:
        read_model_spec(factory, search=[owner], where="training_job")
    assert str(caught.value).startswith("training_job: model = ")
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_config_must_be_json_and_bounded(owner: Path) -> None:
    for config, says in [({"f": float("nan")}, "must hold JSON values only"),
                         ({"p": Path("/x")}, "must hold JSON values only"),
                         ([1, 2], "must be a table with string keys"),
                         ({"big": "x" * 300_000}, "more than 262,144")]:
        with pytest.raises(ModelSpecError, match=says):
            read_model_spec(f"{PKG}.towers:build", config, search=[owner])


def test_installed_and_editable_packages_are_found_too() -> None:
    spec = read_model_spec("airflow_ett.examples.two_tower:build")
    assert spec.name == "two_tower"
    assert spec.code_path is not None and (spec.code_path / "airflow_ett").is_dir()
    # and in a fresh interpreter, nothing of it (nor torch) is imported by finding it
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent('''
        import sys
        from airflow_ett.trainer.model_spec import read_model_spec
        read_model_spec("airflow_ett.examples.two_tower:build")
        print(sorted(m for m in sys.modules if m.startswith(("torch", "airflow_ett.examples"))))
    ''')], capture_output=True, text=True, check=True, timeout=60)
    assert probe.stdout.strip() == "[]", probe.stdout


def test_a_spec_written_by_to_dict_reads_back_and_a_damaged_one_is_named(owner: Path
                                                                         ) -> None:
    from airflow_ett.trainer.model_spec import from_dict

    spec = read_model_spec(f"{PKG}.towers:build", {"dim": 8, "tower": [4, 2]},
                           code_path=owner)
    assert from_dict(spec.to_dict()) == spec
    with pytest.raises(ModelSpecError, match="model: factory = 3: must be a string"):
        from_dict({**spec.to_dict(), "factory": 3})
    with pytest.raises(ModelSpecError, match=r"model: config = \[1\]: must be a mapping"):
        from_dict({**spec.to_dict(), "config": [1]})
