"""The "a skip in CI is a failure" rule, as pytest hooks (imported by tests/conftest.py).

With ETT_REQUIRE_SERVICES=1 (`make test` and CI set it) two kinds of skip are turned into
failures, because each hides tests that CI is meant to run:

- an `integration` test that skips at run time (a service down, a tool missing);
- a test module skipped while it is collected (`pytest.importorskip` or
  `pytest.skip(..., allow_module_level=True)` at module level). Such a skip happens before
  any test item exists, so no marker can be consulted and the run-time rule never sees
  it: a whole file of tests would vanish with one "s" in the summary.

A platform `skipif` on a plain unit test (an x86-only probe) stays a skip: it says the test
does not apply here, not that something CI needs is missing. The variable is read when a
report is made, not at import, so an inner pytest run can set it (tests/test_strict_skips.py).
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

ENV = "ETT_REQUIRE_SERVICES"


def _required() -> bool:
    return os.environ.get(ENV) == "1"


def _reason(longrepr: object) -> str:
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (
        _required()
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("integration") is not None
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"integration test skipped under {ENV}=1 (make test and CI run every tier): "
            f"{_reason(report.longrepr)}"
        )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if _required() and report.skipped and isinstance(collector, pytest.Module):
        report.outcome = "failed"
        report.longrepr = (
            f"test module {collector.nodeid} skipped while being collected under {ENV}=1 "
            f"(every test in it would vanish): {_reason(report.longrepr)}"
        )
    return report
