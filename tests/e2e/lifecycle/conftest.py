"""The package's one Airflow (tests/e2e/lifecycle/shared.py says why and how)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_ett.embedded import EmbeddedAirflow
from tests.airflow_db import migrate
from tests.components import WITHOUT_TRIGGERER


@pytest.fixture(scope="package")
def shared_airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedAirflow]:
    root = tmp_path_factory.mktemp("lifecycle")
    (root / "dags").mkdir()
    (root / "tmp").mkdir()
    with EmbeddedAirflow(root / "home", root / "dags", parallelism=3,
                         extra_env={"TMPDIR": str(root / "tmp")}) as af:
        migrate(af)
        af.start(WITHOUT_TRIGGERER)
        af.wait_until_ready(180.0)
        yield af
