"""The import rules of DESIGN.md section 3 are enforced by ruff, per directory.

Each guarded directory has a ruff.toml that `extend`s the root pyproject.toml and bans
imports with flake8-tidy-imports' `banned-api` (TID251). These tests feed ruff a probe
source on stdin under a path inside each directory (`--stdin-filename`: ruff applies the
configuration of that path, and nothing is written into the source tree), so they fail if
a nested config is deleted, stops extending the root, or stops seeing imports made inside
a function (the case a module-level-only check would miss). The CLI's gate is the other
way round (TID253): nothing heavy at module level, anything inside a command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration  # runs the ruff binary; under make test it must be there


def _ruff() -> Path:
    for candidate in (Path(sys.executable).parent / "ruff", ROOT / ".venv" / "bin" / "ruff"):
        if candidate.is_file():
            return candidate
    pytest.skip("ruff is not installed in the virtualenv (a dev dependency: make setup)")


def _codes(path: str, source: str) -> list[tuple[str, str]]:
    """(code, message) of every finding ruff reports for `source` checked as `path`."""
    proc = subprocess.run(
        [str(_ruff()), "check", "--no-cache", "--exit-zero", "--output-format", "json",
         "--stdin-filename", path, "-"],
        input=source, capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    return [(d["code"], d["message"]) for d in json.loads(proc.stdout)]


def _in_function(statement: str) -> str:
    return f"def probe() -> object:\n    {statement}\n    return probe\n"


BANNED = [
    ("airflow_ett/ett/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/ett/_probe.py", "from airflow.sdk import DAG  # noqa: F401", "airflow"),
    ("airflow_ett/ett/_probe.py", "import sqlalchemy  # noqa: F401", "sqlalchemy"),
    ("airflow_ett/ett/_probe.py", "from alembic import op  # noqa: F401", "alembic"),
    ("airflow_ett/ett/_probe.py", "import torch.nn  # noqa: F401", "torch"),
    ("airflow_ett/ett/attribution/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("trainer/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("trainer/_probe.py", "from airflow.models import Variable  # noqa: F401", "airflow"),
    ("airflow_ett/store/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/rollup/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/rollup/_probe.py", "import sqlalchemy  # noqa: F401", "sqlalchemy"),
    ("airflow_ett/rollup/_probe.py", "import torch  # noqa: F401", "torch"),
    ("airflow_ett/report/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/report/_probe.py", "import sqlalchemy  # noqa: F401", "sqlalchemy"),
    ("airflow_ett/emit/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/scheduling/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/scheduling/_probe.py", "import sqlalchemy  # noqa: F401", "sqlalchemy"),
    ("airflow_ett/scheduling/_probe.py", "import torch  # noqa: F401", "torch"),
    ("airflow_ett/protocol/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/protocol/_probe.py", "import sqlalchemy  # noqa: F401", "sqlalchemy"),
    ("airflow_ett/protocol/_probe.py", "import torch  # noqa: F401", "torch"),
]


@pytest.mark.parametrize(("path", "statement", "module"), BANNED)
def test_a_banned_import_inside_a_function_is_reported(path: str, statement: str,
                                                       module: str) -> None:
    found = _codes(path, _in_function(statement))
    gates = [message for code, message in found if code == "TID251"]
    assert len(gates) == 1, found
    # The message names the module and the rule behind it, so a reader knows why.
    assert f"`{module}` is banned" in gates[0] and "DESIGN.md section 3" in gates[0], gates


ALLOWED = [
    ("airflow_ett/ett/_probe.py", "import msgspec  # noqa: F401"),
    ("airflow_ett/ett/_probe.py", "import airflow_ett.ett.events  # noqa: F401"),
    ("trainer/_probe.py", "import torch  # noqa: F401"),
    ("airflow_ett/store/_probe.py", "import sqlalchemy  # noqa: F401"),
    ("airflow_ett/rollup/_probe.py", "import pendulum  # noqa: F401"),
    ("airflow_ett/emit/_probe.py", "import airflow_ett.store  # noqa: F401"),
    # Not guarded: the Airflow glue may import Airflow.
    ("airflow_ett/plugin/_probe.py", "import airflow  # noqa: F401"),
]


@pytest.mark.parametrize(("path", "statement"), ALLOWED)
def test_an_allowed_import_passes(path: str, statement: str) -> None:
    assert _codes(path, _in_function(statement)) == []


def test_nested_configs_keep_the_root_settings() -> None:
    """A nested ruff.toml that forgot `extend` would lint with ruff's defaults: a long
    line would pass and the complexity gate would be off."""
    long_line = "X = " + repr("x" * 100) + "\n"
    for directory in ("airflow_ett/ett", "trainer", "airflow_ett/store", "airflow_ett/emit",
                      "airflow_ett/cli", "airflow_ett/rollup", "airflow_ett/report",
                      "airflow_ett/scheduling", "airflow_ett/protocol"):
        codes = [code for code, _ in _codes(f"{directory}/_probe.py", long_line)]
        assert codes == ["E501"], (directory, codes)


CLI_HEAVY = ["airflow", "sqlalchemy", "torch", "airflow_ett.store", "airflow_ett.emit",
             "airflow_ett.embedded"]


@pytest.mark.parametrize("module", CLI_HEAVY)
def test_the_cli_imports_nothing_heavy_at_module_level(module: str) -> None:
    """Every command module is imported to build the parser, so a module-level import of
    the store (SQLAlchemy), the emitter or Airflow would load it for `compute` and
    `--help` too (TID253, airflow_ett/cli/ruff.toml). Inside a command, or under
    TYPE_CHECKING, it is fine."""
    top = f"import {module}  # noqa: F401\n"
    found = _codes("airflow_ett/cli/_probe.py", top)
    assert [code for code, _ in found] == ["TID253"], found
    assert f"`{module}` is banned at the module level" in found[0][1]
    statement = f"import {module}  # noqa: F401"
    lazy = ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            f"    {statement}\n\n\n" + _in_function(statement))
    assert _codes("airflow_ett/cli/_probe.py", lazy) == []


@pytest.mark.parametrize("path", ["airflow_ett/cli/_probe.py", "airflow_ett/report/_probe.py"])
def test_riches_own_text_is_for_the_console_alone(path: str) -> None:
    """Everything printed is escaped for the terminal by airflow_ett/console.py's
    `Text`; rich's own keeps ESC and bidi controls, so only console.py may use it."""
    found = _codes(path, _in_function("from rich.text import Text  # noqa: F401"))
    assert [code for code, _ in found] == ["TID251"], found
    assert "airflow_ett.console's Text" in found[0][1]
    assert _codes("airflow_ett/console.py",
                  _in_function("from rich.text import Text  # noqa: F401")) == []
