"""scripts/setup.sh chooses its interpreter from PYTHON= when set, says which one (path and
version), refuses one it cannot use with the reason and what to install, and rebuilds a
.venv made with another interpreter.

Each test runs a copy of the script in a temporary "checkout" (the script works on the
directory above its own), never against the project's .venv. Fake interpreters are small
shell scripts answering the probes setup.sh sends (`-c` with Python source).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration  # runs bash and Python subprocesses


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    for name in ("constraints.txt", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    return tmp_path


def run_setup(checkout: Path, python: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    # pip never reaches an index or wheel directory: a regression that goes on to build
    # fails fast instead of installing the whole project into the temporary checkout
    environ = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    environ.update(PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull)
    if python is not None:
        environ["PYTHON"] = python
    environ.update(env)
    return subprocess.run(["bash", str(checkout / "scripts" / "setup.sh")], cwd=checkout,
                          env=environ, capture_output=True, text=True, timeout=300, check=False)


def fake_python(path: Path, version: str, *, has_venv: bool = True) -> Path:
    """An executable that answers setup.sh's probes like a Python of `version`."""
    minor = ".".join(version.split(".")[:2])
    path.write_text(
        "#!/bin/sh\n"
        'case "$2" in\n'
        f"  *ensurepip*) exit {0 if has_venv else 1};;\n"
        f"  *version_info*) echo {minor};;\n"
        f"  *python_version*) echo {path} {version};;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return path


def test_a_missing_interpreter_is_refused_naming_it(checkout: Path) -> None:
    done = run_setup(checkout, "/nonexistent/python3.11")
    assert done.returncode == 1
    assert "setup: ERROR: PYTHON=/nonexistent/python3.11: no such interpreter" in done.stderr
    assert "apt-get install python3.11 python3.11-venv" in done.stderr
    assert not (checkout / ".venv").exists()


def test_another_python_version_is_refused_with_the_one_needed(
    checkout: Path, tmp_path: Path
) -> None:
    python = fake_python(tmp_path / "python3.12", "3.12.1")
    done = run_setup(checkout, str(python))
    assert done.returncode == 1
    assert f"PYTHON={python} ({python}) refused: it is Python 3.12; airflow-ett needs " \
        "Python 3.11" in done.stderr
    assert not (checkout / ".venv").exists()


def test_a_python_without_venv_is_refused_with_the_package_to_install(
    checkout: Path, tmp_path: Path
) -> None:
    python = fake_python(tmp_path / "python3.11", "3.11.2", has_venv=False)
    done = run_setup(checkout, str(python))
    assert done.returncode == 1
    assert "lacks the venv/ensurepip modules (on Debian/Ubuntu: apt-get install " \
        "python3.11-venv)" in done.stderr
    assert not (checkout / ".venv").exists()


def test_python_is_used_and_named_with_its_version(checkout: Path) -> None:
    """This interpreter (a 3.11) is chosen and printed; the run stops right after, at
    the missing constraints file, before it builds anything."""
    (checkout / "constraints.txt").unlink()
    done = run_setup(checkout, sys.executable)
    real = os.path.realpath(sys._base_executable)
    version = ".".join(map(str, sys.version_info[:3]))
    assert done.stdout.splitlines()[0] == f"setup: using {real} (Python {version})"
    assert "constraints.txt is missing" in done.stderr


@pytest.mark.slow
def test_a_venv_of_another_interpreter_is_rebuilt(checkout: Path) -> None:
    """A .venv whose pyvenv.cfg names another interpreter is removed and built again with
    the chosen one (pip then fails fast: no index, no wheels)."""
    venv = checkout / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys._base_executable))
    (venv / "pyvenv.cfg").write_text("executable = /opt/other/python3.11\nversion = 3.11.0\n")
    (venv / "left-over").write_text("from the old venv")
    done = run_setup(checkout, sys.executable)
    real = os.path.realpath(sys._base_executable)
    assert (
        f"setup: existing .venv was built with /opt/other/python3.11 (Python "
        f"{'.'.join(map(str, sys.version_info[:3]))}): rebuilding it with {real}"
    ) in done.stdout
    assert not (venv / "left-over").exists()
    assert f"executable = {real}" in (venv / "pyvenv.cfg").read_text()
