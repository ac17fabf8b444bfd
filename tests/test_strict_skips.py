"""The CI rule "a skip that hides tests is a failure" (tests/strict_skips.py), tried on an
inner pytest run: a module skipped at collection and an integration test skipped at run
time fail under ETT_REQUIRE_SERVICES=1 and stay skips without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODULE_SKIP = """
import pytest
pytest.importorskip("no_such_module_for_ett_tests")

def test_hidden():
    assert False
"""

INTEGRATION_SKIP = """
import pytest

@pytest.mark.integration
def test_needs_a_service():
    pytest.skip("service down")
"""

PLATFORM_SKIP = """
import pytest

@pytest.mark.skipif(True, reason="not this platform")
def test_x86_only():
    pass

def test_runs():
    pass
"""


def _inner_pytest(
    tmp_path: Path, source: str, *, required: bool
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    integration: real services\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ETT_REQUIRE_SERVICES"}
    env["PYTHONPATH"] = str(ROOT)
    if required:
        env["ETT_REQUIRE_SERVICES"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.strict_skips", "-q", "-rfEs",
         "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("required", [True, False])
def test_a_module_skipped_at_collection(tmp_path: Path, required: bool) -> None:
    result = _inner_pytest(tmp_path, MODULE_SKIP, required=required)
    if required:
        assert result.returncode != 0, result.stdout
        assert "skipped while being collected" in result.stdout
        assert "no_such_module_for_ett_tests" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "1 passed, 1 skipped" in result.stdout


@pytest.mark.parametrize("required", [True, False])
def test_an_integration_test_skipped_at_run_time(tmp_path: Path, required: bool) -> None:
    result = _inner_pytest(tmp_path, INTEGRATION_SKIP, required=required)
    if required:
        assert result.returncode == 1, result.stdout
        assert "1 failed, 1 passed" in result.stdout
        assert "service down" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "1 passed, 1 skipped" in result.stdout


def test_a_platform_skipif_on_a_unit_test_stays_a_skip(tmp_path: Path) -> None:
    result = _inner_pytest(tmp_path, PLATFORM_SKIP, required=True)
    assert result.returncode == 0, result.stdout
    assert "2 passed, 1 skipped" in result.stdout
