"""Fixtures shared by the trainer's test modules."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.trainer.checkpoint import CheckpointError, CheckpointManager


@pytest.fixture
def manager_factory(tmp_path: Path) -> Iterator[Callable[..., CheckpointManager]]:
    """`make(**kwargs)`: a CheckpointManager on `tmp_path / "ckpt"`; every one made is
    closed after the test (a failed save it still holds is not the teardown's business)."""
    made: list[CheckpointManager] = []

    def make(**kwargs: Any) -> CheckpointManager:
        m = CheckpointManager(tmp_path / "ckpt", **kwargs)
        made.append(m)
        return m

    yield make
    for m in made:
        with contextlib.suppress(CheckpointError):
            m.close()
