"""One session of an embedded Airflow, as the `airflow-ett embedded` commands use it:
bring it up, run one DAG to its end, keep serving until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_ett.embedded.harness import EmbeddedAirflow
from airflow_ett.embedded.processes import DEFAULT_COMPONENTS


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished run; (dag_id, run_id) is how its ETT report is looked up."""

    dag_id: str
    run_id: str
    state: str
    task_instances: list[dict[str, Any]]
    trigger_to_end_s: float
    timings: dict[str, float]

    @property
    def succeeded(self) -> bool:
        return self.state == "success"


def run_dag(
    airflow: EmbeddedAirflow,
    dag_id: str,
    *,
    conf: Mapping[str, Any] | None = None,
    timeout: float = 600.0,
    ready_timeout: float = 180.0,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Migrate, start, trigger `dag_id` and wait for its end; the components keep running.

    The caller owns `airflow` (a context manager) and decides when to stop it, so it can
    look at the run, or keep the UI up, before everything goes away.
    """
    say = progress or (lambda _msg: None)
    say(f"migrating the metadata DB in {airflow.home}")
    airflow.migrate()
    say(f"starting {', '.join(DEFAULT_COMPONENTS)} (logs: {airflow.log_dir})")
    airflow.start()
    airflow.wait_until_ready(ready_timeout)
    say(f"ready after {airflow.timings.get('ready_s', 0.0):.1f} s; waiting for DAG {dag_id!r}")
    airflow.wait_for_dag(dag_id, timeout=min(timeout, 120.0))
    airflow.unpause(dag_id)
    begin = time.monotonic()
    run_id = airflow.trigger(dag_id, conf)
    say(f"triggered {run_id}; waiting (timeout {timeout:.0f} s)")
    state = airflow.wait_for_run(dag_id, run_id, timeout=timeout)
    elapsed = time.monotonic() - begin
    return RunResult(dag_id=dag_id, run_id=run_id, state=state,
                     task_instances=airflow.task_instances(dag_id, run_id),
                     trigger_to_end_s=elapsed, timings=dict(airflow.timings))


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt meanwhile, so `with` blocks clean up."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve_until_interrupted(airflow: EmbeddedAirflow, poll: float = 1.0) -> None:
    """Block until Ctrl-C or SIGTERM (returns) or a component dies (ComponentDied)."""
    with terminate_as_interrupt(), contextlib.suppress(KeyboardInterrupt):
        while True:
            airflow.check_alive()
            time.sleep(poll)
