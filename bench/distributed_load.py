"""Throughput of many lifecycle runs at once: the distributed deployment against the
single-machine default, on the same host, in one run.

    python -m bench.distributed_load [--runs 20]

Both run the same DAG (the tiny model's train on the `gpu` queue, then publish on `cpu`;
the distributed tier's `dist_load`) with the same number of task slots (4):

- stock: the embedded default, what a team starts with: SQLite, LocalExecutor
  (`[core] parallelism` 4);
- ours: the deployment of docker/compose.yaml as processes (tests/distributed/cluster.py):
  CeleryExecutor, PostgreSQL, Redis, two `gpu` workers of one slot and a `cpu` worker of
  two.

It prints trigger-to-last-end, runs per hour, and Celery's over LocalExecutor's time:
on one host the distributed engine cannot be faster (the same cores do the work); the
ratio is what its broker, result backend and worker processes cost, which is what a
team pays on one host for the ability to add hosts. No GPU: the trainer runs on CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

from airflow_ett.embedded import EmbeddedAirflow
from tests.distributed.cluster import (
    CeleryAirflow,
    Services,
    throwaway_databases,
    throwaway_redis_db,
)
from tests.distributed.test_celery import DAGS

DAG_ID = "dist_load"
SLOTS = 4


def _load(af: EmbeddedAirflow, runs: int) -> float:
    af.wait_for_dag(DAG_ID, timeout=180.0)
    af.unpause(DAG_ID)
    began = time.monotonic()
    run_ids = [af.trigger(DAG_ID) for _ in range(runs)]
    states = {r: af.wait_for_run(DAG_ID, r, timeout=1800.0) for r in run_ids}
    elapsed = time.monotonic() - began
    failed = {r: s for r, s in states.items() if s != "success"}
    if failed:
        raise SystemExit(f"runs did not succeed: {failed}")
    return elapsed


def _dags(root: Path) -> Path:
    dags = root / "dags"
    dags.mkdir(parents=True)
    (dags / "ett_distributed_dags.py").write_text(textwrap.dedent(DAGS))
    return dags


def local(root: Path, runs: int) -> float:
    dags = _dags(root)
    with EmbeddedAirflow(root / "home", dags, parallelism=SLOTS,
                         extra_env={"TMPDIR": tempfile.mkdtemp(dir=root)}) as af:
        af.migrate()
        af.start()
        af.wait_until_ready(240.0)
        return _load(af, runs)


def celery(root: Path, runs: int) -> float:
    dags = _dags(root)
    with throwaway_databases("airflow", "ett") as dbs, throwaway_redis_db() as redis_db, \
            CeleryAirflow(root / "home", dags, Services(dbs["airflow"], dbs["ett"], redis_db),
                          {"TMPDIR": tempfile.mkdtemp(dir=root),
                           "AIRFLOW__CORE__PARALLELISM": str(SLOTS)},
                          scale={"worker-gpu": 2}) as af:
        af.migrate()
        af.start_all()
        af.wait_until_ready(240.0)
        af.wait_for_workers(timeout=180.0)
        return _load(af, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs = {args.runs}: must be >= 1")
    with tempfile.TemporaryDirectory(prefix="ett-bench-load-") as tmp:
        stock = local(Path(tmp) / "local", args.runs)
        ours = celery(Path(tmp) / "celery", args.runs)
    print(f"{args.runs} runs of {DAG_ID} (train on gpu, publish on cpu; tiny model), "
          f"{SLOTS} task slots, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()} x{os.cpu_count()}")
    print(f"{'setup':<44}{'trigger->last end s':>20}{'runs/h':>10}")
    for name, seconds in (("stock: LocalExecutor, SQLite (embedded)", stock),
                          ("ours: CeleryExecutor, PostgreSQL, Redis", ours)):
        print(f"{name:<44}{seconds:>20.0f}{args.runs * 3600 / seconds:>10.0f}")
    print(f"Celery / LocalExecutor time: {ours / stock:.2f} (on one host: the cost of "
          "the broker, result backend and worker processes)")


if __name__ == "__main__":
    main()
