"""Session-wide test setup, kept minimal. Two things only:

1. Isolation: AIRFLOW_HOME points at a throwaway directory for the whole session (set
   here, before any test module imports Airflow, which reads it once at import), example
   DAGs are off, and inherited `AIRFLOW__ETT__*` / `AIRFLOW_CONFIG` variables are dropped,
   so no test reads or writes a developer's real Airflow setup.
2. Strictness in CI: with ETT_REQUIRE_SERVICES=1 (scripts/test.sh sets it, so `make test`
   and CI have it) an `integration` test that skips (a service not reachable, a tool
   missing) is reported as failed: CI runs every tier, and a skip there would hide it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="ett-tests-airflow-home-"))
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
for _name in [n for n in os.environ if n.startswith("AIRFLOW__ETT__") or n == "AIRFLOW_CONFIG"]:
    del os.environ[_name]

REQUIRE_SERVICES = os.environ.get("ETT_REQUIRE_SERVICES") == "1"


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (
        REQUIRE_SERVICES
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("integration") is not None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            "integration test skipped under ETT_REQUIRE_SERVICES=1 (make test and CI run "
            f"every tier): {reason}"
        )
    return report
