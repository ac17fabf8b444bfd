"""What one pytest worker takes at a time (tests/conftest.py): a test's file, or the whole
of a package whose modules share a package-scoped service."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SHARED_PACKAGES, scope_of

ROOT = Path(__file__).resolve().parents[1]


def test_a_test_goes_with_its_file() -> None:
    assert scope_of("tests/emit/test_emit_spool.py::test_x[a::b]") == \
        "tests/emit/test_emit_spool.py"
    assert scope_of("tests/e2e/test_preemption.py::test_y") == "tests/e2e/test_preemption.py"


def test_the_modules_of_a_shared_package_are_one_scope() -> None:
    scopes = {scope_of(f"tests/e2e/lifecycle/{name}.py::test_z")
              for name in ("test_command_dag", "test_lifecycle_dags", "test_owner_dag")}
    assert scopes == {"tests/e2e/lifecycle/"}
    assert scope_of("tests/e2e/lifecycle_other.py::t") == "tests/e2e/lifecycle_other.py"


def test_each_shared_package_has_the_conftest_of_its_shared_fixture() -> None:
    for package in SHARED_PACKAGES:
        assert package.endswith("/")
        conftest = ROOT / package / "conftest.py"
        assert 'scope="package"' in conftest.read_text(encoding="utf-8"), package
