"""The distribution: what the wheel holds, what the metadata declares, what imports Airflow.

The layout (docs/decisions/0003-package-layout.md): `operators/` and `trainer/` reach
the wheel as `airflow_ett.operators` and `airflow_ett.trainer` through symlinks, and
nothing but `airflow_ett` goes to the top level of site-packages.
"""

from __future__ import annotations

import configparser
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Not copied into the build tree: environments, VCS, caches, earlier build output.
_SKIP_TOP = {".venv", ".git", "build", "dist", "airflow_home", "node_modules"}
_SKIP_ANY = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n in _SKIP_ANY or n.endswith(".egg-info")}
    if Path(directory) == ROOT:
        skip |= {n for n in names if n in _SKIP_TOP}
    return skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """A wheel built from a copy of the checkout (symlinks kept as symlinks).

    A copy, because setuptools builds in the source tree and its build/ directory keeps
    files deleted since: a wheel built in place could pass with stale contents.
    """
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_ignore)
    assert (src / "airflow_ett" / "trainer").is_symlink(), "the copy must keep the symlinks"
    out = work / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (built,) = out.glob("airflow_ett-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


@pytest.mark.integration
@pytest.mark.slow
def test_wheel_holds_symlinked_packages_as_real_files(wheel: zipfile.ZipFile) -> None:
    for package in ("operators", "trainer"):
        name = f"airflow_ett/{package}/__init__.py"
        info = wheel.getinfo(name)  # KeyError: not in the wheel
        mode = info.external_attr >> 16
        assert not stat.S_ISLNK(mode), f"{name} is stored as a symlink"
        assert wheel.read(name) == (ROOT / package / "__init__.py").read_bytes()


@pytest.mark.integration
@pytest.mark.slow
def test_wheel_has_only_airflow_ett_at_top_level(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    (dist_info,) = [t for t in tops if t.endswith(".dist-info")]
    assert tops == {"airflow_ett", dist_info}, f"unexpected top-level entries: {sorted(tops)}"
    assert wheel.read(f"{dist_info}/top_level.txt").decode().split() == ["airflow_ett"]


@pytest.mark.integration
@pytest.mark.slow
def test_wheel_ships_every_module_and_the_typing_marker(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    package = ROOT / "airflow_ett"
    expected = {
        path.relative_to(ROOT).as_posix()
        for path in package.rglob("*.py")  # rglob follows the two symlinks
        if "__pycache__" not in path.parts
    }
    assert expected, "found no sources to compare"
    assert sorted(expected - names) == []
    assert "airflow_ett/py.typed" in names
    # data the code opens at run time: the default components file, the migrations, the
    # HTML report's template and its vendored chart library
    data = {p.relative_to(ROOT).as_posix() for pattern in (
        "rollup/*.toml", "scheduling/*.toml", "store/migrations/*.mako", "report/templates/*.j2",
        "report/static/*",
        "plugin/web/templates/*.j2", "plugin/web/static/*")
        for p in package.glob(pattern)}
    assert len(data) >= 10 and sorted(data - names) == []


@pytest.mark.integration
@pytest.mark.slow
def test_wheel_declares_the_entry_points(wheel: zipfile.ZipFile) -> None:
    (dist_info,) = {n.split("/", 1)[0] for n in wheel.namelist() if ".dist-info/" in n}
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep names' case
    parser.read_string(wheel.read(f"{dist_info}/entry_points.txt").decode())
    declared = {(section, name): value for section in parser.sections()
                for name, value in parser[section].items()}
    assert declared[("airflow.plugins", "airflow_ett")] == "airflow_ett.plugin:AirflowEttPlugin"
    assert declared[("apache_airflow_provider", "provider_info")] == (
        "airflow_ett.provider:get_provider_info"
    )
    assert declared[("console_scripts", "airflow-ett")] == "airflow_ett.cli:main"
    assert declared[("airflow.policy", "airflow_ett")] == "airflow_ett.plugin.policy"


def _entry_point(group: str, name: str) -> metadata.EntryPoint:
    found = metadata.distribution("airflow-ett").entry_points.select(group=group, name=name)
    assert len(found) == 1, f"installed airflow-ett declares no {group} entry point {name!r}"
    (entry_point,) = found
    return entry_point


def test_installed_metadata_declares_the_airflow_plugin() -> None:
    assert _entry_point("airflow.plugins", "airflow_ett").value == (
        "airflow_ett.plugin:AirflowEttPlugin"
    )


def test_installed_metadata_declares_the_provider() -> None:
    entry_point = _entry_point("apache_airflow_provider", "provider_info")
    assert entry_point.value == "airflow_ett.provider:get_provider_info"
    info = entry_point.load()()
    assert info["package-name"] == "airflow-ett"
    assert info["versions"][0] == metadata.version("airflow-ett")
    assert set(info["config"]["ett"]["options"]) == {
        "store_url", "disabled", "spool_dir", "emit_timeout", "work_dir", "rollup_timezone",
        "components_file", "rollup_recompute_days", "rollup_catchup_days", "report_dir",
        "whatif_cut_pct", "whatif_start_s", "rollup_silent_after_s", "tenants_file",
        "rolling_windows", "rolling_metrics_interval_s",
    }


def test_installed_metadata_declares_the_console_script() -> None:
    entry_point = _entry_point("console_scripts", "airflow-ett")
    assert entry_point.value == "airflow_ett.cli:main"
    assert callable(entry_point.load())


def test_version_matches_the_distribution() -> None:
    import airflow_ett

    assert airflow_ett.__version__ == metadata.version("airflow-ett")


# Modules that run where Airflow must not be imported: the trainer (alone under torchrun),
# the pure ETT model, the emitter the trainer reports through, and the settings reader.
_AIRFLOW_FREE = """
import importlib, importlib.util, pkgutil, sys
import airflow_ett.trainer, airflow_ett.ett.attribution, airflow_ett.settings, airflow_ett.provider
for package in ("airflow_ett.ett", "airflow_ett.emit", "airflow_ett.trainer"):
    if importlib.util.find_spec(package) is None:
        continue
    for module in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        importlib.import_module(module.name)
loaded = sorted(m for m in sys.modules if m == "airflow" or m.startswith("airflow."))
assert not loaded, f"imported Airflow: {loaded[:5]}"
for name in ("operators", "trainer"):
    assert importlib.util.find_spec(name) is None, f"a top-level {name!r} is importable"
print("ok")
"""


@pytest.mark.integration
def test_trainer_ett_emit_and_settings_never_import_airflow(tmp_path: Path) -> None:
    # A fresh interpreter, run outside the checkout, so only the installed package counts.
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _AIRFLOW_FREE],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_missing_torchrec_is_one_line_that_says_how_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torchrec'] = None\n"  # what an absent package looks like
        "from airflow_ett.trainer import require_torchrec\n"
        "require_torchrec()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "TorchRecMissingError: torchrec is not installed: run `pip install --no-deps " \
        "torchrec==1.8.0`" in last
