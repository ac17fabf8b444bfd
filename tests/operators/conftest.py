"""Operators without a scheduler: `execute(context)` with a small hand-built context.

The context holds what the operators read: `ti` (ids, try number, max tries), `params`
and a `task_state_store`. The real task runner gives a store that talks to the
supervisor; `DictStateStore` stands in for it here (tests that need the real one run in
tests/e2e on a real scheduler).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ett.emit import reset_default_emitter
from airflow_ett.store import EttStore, upgrade


class DictStateStore(dict[str, Any]):
    """The two methods of Airflow's TaskStateStoreAccessor the train operator uses."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


def context(run_id: str, *, try_number: int = 1, max_tries: int = 0,
            params: dict[str, Any] | None = None, store: DictStateStore | None = None,
            dag_id: str = "ett_test") -> dict[str, Any]:
    return {
        "ti": SimpleNamespace(dag_id=dag_id, run_id=run_id, try_number=try_number,
                              max_tries=max_tries),
        "params": params or {},
        "task_state_store": store if store is not None else DictStateStore(),
    }


TINY: dict[str, Any] = {
    "model": "dlrm_tiny", "steps": 30, "batch_size": 64, "compile": False, "num_workers": 0,
    "checkpoint_interval": 10, "log_every_s": 1.0, "seed": 7,
    # no spare processes where the test is not about them (a spare costs a trainer's
    # start-up in CPU); test_train_operator turns it on where it is
    "optimizations": {"warm_standby": False},
}


@pytest.fixture
def ett_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An AIRFLOW_HOME of its own: the ETT store (migrated) and work dir live in it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    reset_default_emitter()
    upgrade()
    yield home
    reset_default_emitter()


def store_events(job: str) -> list[Any]:
    """The job's events in the store, after the process's emitter delivered them."""
    from airflow_ett.emit import get_emitter

    assert get_emitter().flush(10.0)
    with EttStore() as store:
        return store.job_events(job)


def store_summary(job: str) -> dict[str, Any]:
    from airflow_ett.emit import get_emitter

    assert get_emitter().flush(10.0)
    with EttStore() as store:
        return store.summary(job)


def execute_in_thread(op: Any, run_id: str, **context_args: Any
                      ) -> tuple[threading.Thread, dict[str, Any]]:
    """`op.execute(context(run_id, **context_args))` on a thread not yet started, so that
    a test can kill the task meanwhile; its return value lands in `outcome["result"]`, an
    exception in `outcome["error"]`."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = op.execute(context(run_id, **context_args))
        except BaseException as exc:
            outcome["error"] = exc

    return threading.Thread(target=run), outcome


def started_trainer(op: Any, thread: threading.Thread, outcome: dict[str, Any],
                    deadline: float) -> Any:
    """The trainer process `op` started (its `_proc`), once it has one; fails the test if
    the task ends or `deadline` (time.monotonic()) passes first."""
    while op._proc is None:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.05)
    return op._proc
