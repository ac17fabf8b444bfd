"""The import rules of DESIGN.md section 3 are enforced by ruff, per directory.

Every part's folder has a ruff.toml that `extend`s the root pyproject.toml and bans, with
flake8-tidy-imports' `banned-api` (TID251), the third-party modules it must not import and
every part of the package it may not import: `MAY_IMPORT` below is docs/architecture.md's
"may import" rule of each part, and the bans must be exactly its complement. These tests
feed ruff a probe source on stdin under a path inside each directory (`--stdin-filename`:
ruff applies the configuration of that path, and nothing is written into the source
tree), so they fail if a nested config is deleted, stops extending the root, stops seeing
imports made inside a function (the case a module-level-only check would miss) or lets a
part through. Relative imports are banned everywhere (TID252): in the repository-root
trainer/ and operators/ ruff could not resolve one to a banned part. The CLI's gate is
also the other way round (TID253): nothing heavy at module level, anything inside a
command; emit/, plugin/ and operators/ have such module-level gates too.

ruff has no per-file bans, so the single files of airflow_ett/ share one ruff.toml; the
exact rule of each (`TOP_LEVEL`) is checked on their syntax trees.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "airflow_ett"

pytestmark = pytest.mark.integration  # runs the ruff binary; under make test it must be there


def _ruff() -> Path:
    for candidate in (Path(sys.executable).parent / "ruff", ROOT / ".venv" / "bin" / "ruff"):
        if candidate.is_file():
            return candidate
    pytest.skip("ruff is not installed in the virtualenv (a dev dependency: make setup)")


def _codes(path: str, source: str) -> list[tuple[str, str]]:
    """(code, message) of every finding ruff reports for `source` checked as `path`."""
    return [(code, message) for code, message, _ in _findings(path, source)]


def _findings(path: str, source: str) -> list[tuple[str, str, int]]:
    """(code, message, line) of every finding ruff reports for `source` checked as `path`."""
    proc = subprocess.run(
        [str(_ruff()), "check", "--no-cache", "--exit-zero", "--output-format", "json",
         "--stdin-filename", path, "-"],
        input=source, capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    return [(d["code"], d["message"], d["location"]["row"]) for d in json.loads(proc.stdout)]


def _in_function(statement: str) -> str:
    return f"def probe() -> object:\n    {statement}\n    return probe\n"


#: Each folder's "may import" rule (docs/architecture.md, "The parts"): the parts of the
#: package it may import. A part is a subpackage (`ett`), a single file (`_fs`), or one
#: module of a subpackage (`scheduling.limits`) where only some of it is allowed. Every
#: other part is banned by the folder's ruff.toml; "airflow_ett" is the single files'.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "airflow_ett": frozenset({"provider"}),  # each file's own rule: TOP_LEVEL
    "airflow_ett/adapters": frozenset({"emit", "protocol", "ett"}),
    "airflow_ett/cli": frozenset({"_fs", "_proc", "_untrusted", "console", "embedded", "emit",
                                  "ett", "jobs", "masking", "plugin", "protocol", "provider",
                                  "report", "rollup", "scheduling", "settings", "store"}),
    "airflow_ett/embedded": frozenset({"_fs", "_proc", "_untrusted"}),
    "airflow_ett/emit": frozenset({"ett", "settings", "masking", "_fs", "store"}),
    "airflow_ett/ett": frozenset({"_untrusted"}),
    "airflow_ett/examples": frozenset({"adapters", "trainer"}),
    "airflow_ett/plugin": frozenset({"emit", "ett", "jobs", "protocol", "report", "rollup",
                                     "scheduling", "settings", "store", "operators"}),
    "airflow_ett/protocol": frozenset({"scheduling.limits", "scheduling.model", "_fs",
                                       "_untrusted", "ett"}),
    "airflow_ett/report": frozenset({"ett", "rollup", "_fs", "console"}),
    "airflow_ett/rollup": frozenset({"ett", "_untrusted"}),
    "airflow_ett/scheduling": frozenset({"ett", "rollup", "protocol.request", "_untrusted",
                                         "settings"}),
    "airflow_ett/store": frozenset({"ett", "rollup", "settings", "masking"}),
    "operators": frozenset({"trainer", "protocol", "emit", "store", "ett", "rollup", "report",
                            "jobs", "settings", "_fs", "_proc", "_untrusted"}),
    "trainer": frozenset({"protocol", "emit", "ett", "store", "settings", "_fs", "_proc",
                          "_untrusted"}),
}


def _own_part(folder: str) -> str | None:
    """The part a folder is (`airflow_ett/ett` -> `ett`; the single files are none)."""
    return None if folder == "airflow_ett" else folder.rsplit("/", 1)[-1]


def _parts() -> list[str]:
    """Every part of the package, from the file system: each subpackage (operators/ and
    trainer/ through their symlinks) and each single file."""
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    files = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    return sorted(packages + files)


def _modules(part: str) -> list[str]:
    return sorted(p.stem for p in (PACKAGE / part).glob("*.py") if p.stem != "__init__")


def _banned(folder: str) -> set[str]:
    """What the folder's ruff.toml must ban: every part but its own and those it may
    import; where only some modules of a part are allowed, each of its other modules."""
    allowed = MAY_IMPORT[folder]
    out = set()
    for part in _parts():
        if part == _own_part(folder) or part in allowed:
            continue
        some = {a.split(".", 1)[1] for a in allowed if a.startswith(part + ".")}
        if some:
            out |= {f"airflow_ett.{part}.{m}" for m in _modules(part) if m not in some}
        else:
            out.add(f"airflow_ett.{part}")
    return out


def _ruff_toml(folder: str) -> dict[str, dict[str, str]]:
    """The folder's `lint.flake8-tidy-imports.banned-api` table."""
    config = tomllib.loads((ROOT / folder / "ruff.toml").read_text())
    bans: dict[str, dict[str, str]] = config["lint"]["flake8-tidy-imports"]["banned-api"]
    return bans


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
    ("airflow_ett/protocol/_probe.py", "from alembic import op  # noqa: F401", "alembic"),
    ("airflow_ett/adapters/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/adapters/_probe.py", "import sqlalchemy  # noqa: F401", "sqlalchemy"),
    ("airflow_ett/embedded/_probe.py", "from airflow.models import DAG  # noqa: F401",
     "airflow"),
    ("airflow_ett/examples/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/_probe.py", "import airflow  # noqa: F401", "airflow"),
    ("airflow_ett/_probe.py", "import torch  # noqa: F401", "torch"),
    # A part, written every way an import can name it.
    ("airflow_ett/report/_probe.py", "from airflow_ett import store  # noqa: F401",
     "airflow_ett.store"),
    ("airflow_ett/report/_probe.py", "from airflow_ett.store.daily import X  # noqa: F401",
     "airflow_ett.store"),
    ("trainer/_probe.py", "import airflow_ett.scheduling.limits  # noqa: F401",
     "airflow_ett.scheduling"),
    ("operators/_probe.py", "from airflow_ett.cli.report import X  # noqa: F401",
     "airflow_ett.cli"),
    # protocol/ may import two scheduling modules, no other (and the reverse: one).
    ("airflow_ett/protocol/_probe.py", "from airflow_ett.scheduling import tenants  # noqa: F401",
     "airflow_ett.scheduling.tenants"),
    ("airflow_ett/scheduling/_probe.py", "from airflow_ett.protocol import leave  # noqa: F401",
     "airflow_ett.protocol.leave"),
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
    ("operators/_probe.py", "from airflow.sdk import DAG  # noqa: F401"),
    ("airflow_ett/protocol/_probe.py", "from airflow_ett.scheduling import limits  # noqa: F401"),
    ("airflow_ett/protocol/_probe.py", "from airflow_ett.scheduling.model import X  # noqa: F401"),
    ("airflow_ett/scheduling/_probe.py", "from airflow_ett.protocol import request  # noqa: F401"),
    ("airflow_ett/_probe.py", "from airflow_ett.provider import X  # noqa: F401"),
    ("airflow_ett/cli/_probe.py", "from airflow_ett import console  # noqa: F401"),
    ("airflow_ett/report/_probe.py", "from airflow_ett.console import Text  # noqa: F401"),
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
                      "airflow_ett/scheduling", "airflow_ett/protocol", *MAY_IMPORT):
        codes = [code for code, _ in _codes(f"{directory}/_probe.py", long_line)]
        assert codes == ["E501"], (directory, codes)


CLI_HEAVY = ["airflow", "sqlalchemy", "torch", "airflow_ett.store", "airflow_ett.emit",
             "airflow_ett.embedded", "airflow_ett.plugin"]


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


# -- every part's "may import" rule --------------------------------------------------------

def _label(folder: str) -> str:
    """How a folder's ban messages name it."""
    return "airflow_ett/*.py" if folder == "airflow_ett" else f"{folder}/"


def test_every_part_has_its_own_ruff_toml_and_a_rule() -> None:
    """A new subfolder falls under airflow_ett/ruff.toml (it may import no part at all)
    until it gets its own ruff.toml and a rule here; a ruff.toml deeper down would replace
    its folder's bans (a nested banned-api table replaces the parent's whole)."""
    configs = set()
    for top in ("airflow_ett", "trainer", "operators"):
        for here, _, files in os.walk(ROOT / top):  # symlinks are not followed
            if "ruff.toml" in files:
                configs.add(Path(here).relative_to(ROOT).as_posix())
    assert configs == set(MAY_IMPORT)
    packages = {p for p in _parts() if (PACKAGE / p).is_dir()}
    named = {_own_part(folder) for folder in MAY_IMPORT} - {None}
    assert named == packages


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_each_ruff_toml_bans_exactly_the_parts_its_folder_may_not_import(folder: str) -> None:
    """The ban list is the complement of the rule, part by part: a part (or a scheduling or
    protocol module) added to the package fails here until every ruff.toml says what its
    folder may do with it."""
    bans = {module for module in _ruff_toml(folder) if module.startswith("airflow_ett.")}
    assert sorted(bans - _banned(folder)) == [], "banned, though the rule allows it"
    assert sorted(_banned(folder) - bans) == [], "not banned, though the rule forbids it"


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_every_ban_names_its_folder_what_it_may_import_and_the_rule(folder: str) -> None:
    for module, entry in _ruff_toml(folder).items():
        message = entry["msg"]
        assert message.startswith(_label(folder)), (module, message)
        assert "may import" in message and "DESIGN.md section 3" in message, (module, message)


def _part_probes(folder: str) -> Iterator[tuple[str, str | None]]:
    """(module to import, the banned name ruff must report or None) for every part of the
    package but the folder's own; each module of a part allowed only in part."""
    allowed = MAY_IMPORT[folder]
    for part in _parts():
        if part == _own_part(folder):
            continue
        some = {a for a in allowed if a.startswith(part + ".")}
        if some:
            for module in _modules(part):
                name = f"airflow_ett.{part}.{module}"
                yield name, None if f"{part}.{module}" in some else name
        else:
            name = f"airflow_ett.{part}"
            yield name, None if part in allowed else name


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_a_folder_may_import_the_parts_its_rule_names_and_no_other(folder: str) -> None:
    """Each part imported twice, under TYPE_CHECKING and inside a function (module level is
    the plain case), in one probe per folder: a banned part is exactly one TID251 on its
    line, naming it; an allowed one is nothing."""
    probes = list(_part_probes(folder))
    lines = ["from typing import TYPE_CHECKING", "", "if TYPE_CHECKING:"]
    expected = []
    for module, banned in probes:
        lines.append(f"    import {module}  # noqa: F401")
        if banned:
            expected.append((len(lines), "TID251", banned))
    for i, (module, banned) in enumerate(probes):
        lines += ["", "", f"def probe_{i}() -> object:", f"    import {module}  # noqa: F401"]
        if banned:
            expected.append((len(lines), "TID251", banned))
        lines.append(f"    return probe_{i}")
    found = [(row, code, message.split("`")[1])
             for code, message, row in _findings(f"{folder}/_probe.py", "\n".join(lines) + "\n")
             if code.startswith("TID")]
    assert sorted(found) == sorted(expected)
    assert expected and any(banned is None for _, banned in probes)  # both kinds probed


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_relative_imports_are_banned_in_every_folder(folder: str) -> None:
    found = _codes(f"{folder}/_probe.py", _in_function("from . import sibling  # noqa: F401"))
    assert [code for code, _ in found] == ["TID252"], found


def test_a_relative_import_of_a_banned_part_is_reported_as_that_part() -> None:
    """Inside airflow_ett/ ruff resolves a relative import, so the part's ban holds too."""
    found = _codes("airflow_ett/report/_probe.py",
                   _in_function("from ..store import daily  # noqa: F401"))
    assert sorted(code for code, _ in found) == ["TID251", "TID252"], found
    assert any("`airflow_ett.store` is banned" in message for _, message in found)


@pytest.mark.parametrize("folder", ["trainer", "operators"])
def test_a_parent_relative_import_at_the_repository_root_is_still_reported(folder: str) -> None:
    """ruff sees trainer/ and operators/ as top-level packages, so it cannot resolve
    `from .. import cli` to airflow_ett.cli there (TID251 misses it): TID252 catches it."""
    found = _codes(f"{folder}/_probe.py", _in_function("from .. import cli  # noqa: F401"))
    assert "TID252" in [code for code, _ in found], found


# -- module-level gates (TID253) --------------------------------------------------------------

MODULE_LEVEL_ONLY = [
    # the sink imports the store on its first write; the trainer need not load SQLAlchemy
    ("airflow_ett/emit/_probe.py", "airflow_ett.store"),
    # Airflow loads the plugin in every process: the store and the operators on first use
    ("airflow_ett/plugin/_probe.py", "airflow_ett.store"),
    ("airflow_ett/plugin/web/_probe.py", "airflow_ett.store"),
    ("airflow_ett/plugin/_probe.py", "airflow_ett.operators"),
    # DAG files are parsed without torch: a task imports it when it runs
    ("operators/_probe.py", "torch"),
    ("operators/_probe.py", "torchrec"),
]


@pytest.mark.parametrize(("path", "module"), MODULE_LEVEL_ONLY)
def test_a_lazy_import_stays_inside_a_function(path: str, module: str) -> None:
    top = f"import {module}  # noqa: F401\n"
    found = _codes(path, top)
    assert [code for code, _ in found] == ["TID253"], found
    assert f"`{module}` is banned at the module level" in found[0][1]
    statement = f"import {module}  # noqa: F401"
    lazy = ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            f"    {statement}\n\n\n" + _in_function(statement))
    assert _codes(path, lazy) == []


@pytest.mark.parametrize("path", ["airflow_ett/plugin/web/app.py",
                                  "airflow_ett/plugin/web/deps.py"])
def test_the_ett_pages_may_import_the_store_at_module_level(path: str) -> None:
    """web/ is built on the first read of the plugin's fastapi_apps, in the API server
    only: its app and dependencies are exempt (the probe above shows web/ is not)."""
    assert _codes(path, "import airflow_ett.store  # noqa: F401\n") == []


# -- the single files of airflow_ett/ --------------------------------------------------------

#: airflow_ett/<name>.py -> what of the package it may import (DESIGN.md section 3): the
#: single files are leaves every part imports; settings reads provider's defaults and, in
#: RollupSettings.load, checks the time zone with rollup/calendar.
TOP_LEVEL: dict[str, frozenset[str]] = {
    "__init__": frozenset(),
    "_fs": frozenset(),
    "_proc": frozenset(),
    "_untrusted": frozenset(),
    "console": frozenset(),
    "jobs": frozenset(),
    "masking": frozenset(),
    "provider": frozenset(),
    "settings": frozenset({"provider", "rollup.calendar"}),
}


def _package_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, name under airflow_ett) of every import of the package in a single file's
    tree: at any depth (functions, TYPE_CHECKING), relative ones resolved against
    airflow_ett, and `from P import n` read as P.n (as ruff does)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["airflow_ett", *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "airflow_ett" or name.startswith("airflow_ett."):
                yield node.lineno, name.removeprefix("airflow_ett").lstrip(".")


def _disallowed(path: Path) -> list[str]:
    """`line: name` of each import of the package a single file's rule does not allow."""
    allowed = TOP_LEVEL[path.stem]
    parts = set(_parts())
    out = []
    for line, name in _package_imports(ast.parse(path.read_text(), str(path))):
        if not name or name.split(".")[0] not in parts:
            continue  # the root package itself (import-free), or a name of it
        if not any(name == a or name.startswith(a + ".") for a in allowed):
            out.append(f"{line}: {name}")
    return out


def test_every_single_file_has_its_rule() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(TOP_LEVEL)


@pytest.mark.parametrize("name", sorted(TOP_LEVEL))
def test_a_single_file_imports_only_what_its_rule_allows(name: str) -> None:
    assert _disallowed(PACKAGE / f"{name}.py") == []


@pytest.mark.parametrize(("name", "source", "reported"), [
    ("jobs", "def f() -> None:\n    from airflow_ett import masking\n", ["2: masking"]),
    ("jobs", "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
             "    import airflow_ett.settings\n", ["4: settings"]),
    ("jobs", "from . import settings\n", ["1: settings"]),
    ("jobs", "from .rollup.calendar import check_tz\n", ["1: rollup.calendar.check_tz"]),
    ("console", "import airflow_ett.cli.render\n", ["1: cli.render"]),
    ("settings", "from airflow_ett.rollup import day_of\n", ["1: rollup.day_of"]),
    ("settings", "def f() -> None:\n    from .rollup.calendar import check_tz\n", []),
    ("settings", "from airflow_ett.provider import CONFIG_DEFAULTS\n", []),
    ("jobs", "from airflow_ett import __version__\nimport airflow_ett\n", []),
])
def test_the_single_file_check_sees_every_way_to_import(name: str, source: str,
                                                        reported: list[str],
                                                        tmp_path: Path) -> None:
    """The check above, on a violating file written under the single file's name."""
    probe = tmp_path / f"{name}.py"
    probe.write_text(source)
    assert _disallowed(probe) == reported


def test_the_architecture_doc_names_every_folder_with_a_ruff_toml() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    start = doc.index("The \"may import\" rules below are enforced")
    sentence = doc[start:doc.index("## The parts")]
    for folder in MAY_IMPORT:
        assert f"`{folder}/`" in sentence, folder


# -- no import circle -------------------------------------------------------------------------

def _module_paths(root: Path) -> dict[str, Path]:
    """The package's modules by name: airflow_ett/ (not through its trainer and operators
    symlinks) and the repository-root trainer/ and operators/ they point at."""
    out = {}
    for top, name in (("airflow_ett", "airflow_ett"), ("trainer", "airflow_ett.trainer"),
                      ("operators", "airflow_ett.operators")):
        for here, _, files in os.walk(root / top):  # symlinks are not followed
            for file in files:
                if file.endswith(".py"):
                    rel = (Path(here) / file).relative_to(root / top).with_suffix("").parts
                    dotted = [name, *rel[:-1]] + ([] if rel[-1] == "__init__" else [rel[-1]])
                    out[".".join(dotted)] = Path(here) / file
    return out


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports: at any depth (functions, TYPE_CHECKING),
    `from P import n` as P.n when that is a module, and each package whose __init__ an
    import runs first (importing a.b.c runs a.b), but not a module's own packages."""
    modules = _module_paths(root)

    def known(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = known(name)
                while target is not None and target != module:
                    if not module.startswith(target + "."):
                        graph[module].add(target)
                    target = target.rsplit(".", 1)[0] if "." in target else None
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, directly or not, sorted."""
    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for other in graph[todo.pop()] - seen:
                seen.add(other)
                todo.append(other)
        return seen

    reachable = {node: reach(node) for node in graph}
    groups = {frozenset({node} | {m for m in reachable[node] if node in reachable[m]})
              for node in graph if node in reachable[node]}
    return sorted(sorted(group) for group in groups)


def test_no_module_imports_its_way_round_a_circle() -> None:
    """Not even through a TYPE_CHECKING import or a package's __init__ (mypy and a
    reader follow those too): a shared piece lives where both sides may import it."""
    graph = _import_graph(ROOT)
    assert len(graph) > 150 and "airflow_ett.trainer.faults" in graph
    assert _circles(graph) == []


def test_a_type_only_circle_is_found(tmp_path: Path) -> None:
    """The check above, on a package written to a temp dir: a TYPE_CHECKING import back,
    and a circle closed by a package's __init__."""
    package = tmp_path / "airflow_ett"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from airflow_ett.b import B\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                  "    from airflow_ett.a import A\n")
    (package / "sub" / "__init__.py").write_text("from airflow_ett.sub import x\n")
    (package / "sub" / "x.py").write_text("def f() -> None:\n    import airflow_ett.c\n")
    (package / "c.py").write_text("from airflow_ett.sub.y import Y\n")
    (package / "sub" / "y.py").write_text("")
    assert _circles(_import_graph(tmp_path)) == [
        ["airflow_ett.a", "airflow_ett.b"],
        ["airflow_ett.c", "airflow_ett.sub", "airflow_ett.sub.x"],
    ]
