"""Session-wide test setup, kept minimal. Four things only:

1. Isolation: AIRFLOW_HOME points at a throwaway directory for the whole session (set
   here, before any test module imports Airflow, which reads it once at import), example
   DAGs are off, and inherited `AIRFLOW__ETT__*` / `AIRFLOW_CONFIG` variables are dropped,
   so no test reads or writes a developer's real Airflow setup.
2. Strictness in CI (tests/strict_skips.py): with ETT_REQUIRE_SERVICES=1 (scripts/test.sh
   sets it, so `make test` and CI have it) an `integration` test that skips (a service not
   reachable, a tool missing) and a test module skipped while it is collected (a
   module-level `pytest.importorskip`, `pytest.skip(allow_module_level=True)`) are
   reported as failed: CI runs every tier, and a skip there would hide it.
3. One torch thread per process (`OMP_NUM_THREADS=1`, inherited by every child: trainers,
   Airflow's tasks): the suite runs three workers on two cores, each often beside a
   trainer or two, and torch's default of a thread per core had every process's
   parallel regions fight the others' for the cores (and spin while they waited).
4. Order and grouping: the test files whose tests are marked `slow` run first. With several
   pytest workers each taking a whole file at a time (scripts/test.sh, `--dist loadfile`),
   the long real-service files start at once and the many quick files fill in beside
   them, instead of one long file starting last and running alone. The packages in
   `SHARED_PACKAGES` go to a worker whole, as one file would: their modules share a
   package-scoped service (tests/e2e/lifecycle/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

# The strictness hooks live in a module of their own so that a test can load them into an
# inner pytest run and watch them fail a skip (tests/test_strict_skips.py).
from tests.strict_skips import (  # noqa: F401 (hooks, found by name)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="ett-tests-airflow-home-"))
os.environ["AIRFLOW_HOME"] = str(_AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ.setdefault("OMP_NUM_THREADS", "1")
for _name in [n for n in os.environ if n.startswith("AIRFLOW__ETT__") or n == "AIRFLOW_CONFIG"]:
    del os.environ[_name]


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a `slow` test first, each file's tests in their own order (a module's
    fixtures are set up once either way). Deterministic, so every worker of a parallel
    run collects the same order."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within


#: Test packages whose modules share a package-scoped fixture: one worker runs all of
#: them, one module after the other (a package fixture is set up once per worker).
SHARED_PACKAGES = ("tests/e2e/lifecycle/",)


def scope_of(nodeid: str) -> str:
    """What one worker takes at a time: the test's file, or its shared package."""
    path = nodeid.split("::", 1)[0]
    return next((package for package in SHARED_PACKAGES if path.startswith(package)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with each of `SHARED_PACKAGES` one scope. (xdist's own
    `loadgroup` cannot do it under pytest 9: the group it appends to a node id is lost.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedPackageScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return SharedPackageScheduling(config, log)
