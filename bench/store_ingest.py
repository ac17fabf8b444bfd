"""ETT store ingest throughput: events/s with concurrent writer processes.

Each writer process plays the emitter of its own share of the jobs (batches of one job's
events, as the emitter sends them) and also replays a slice of the next writer's events,
as a spool replay would, so writers race on the same event ids and the same job rows. At
the end it checks that nothing was lost or doubled: stored rows == distinct ids sent ==
sum of "new" counts returned, and the jobs' versions add up to the same number.

    python bench/store_ingest.py                          # 200k events, both backends
    python bench/store_ingest.py --events 50000 --backend sqlite --writers 4

PostgreSQL runs in a throwaway database (`ett_bench_<random>`, dropped at the end) on the
server named by --pg-dsn; SQLite in a temporary file.
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENTS_PER_JOB = 1000
REPLAY_SHARE = 0.10


@dataclass(frozen=True)
class Plan:
    events: int
    writers: int
    batch: int

    @property
    def jobs(self) -> int:
        return max(1, self.events // EVENTS_PER_JOB)

    def job_sizes(self) -> list[int]:
        base, extra = divmod(self.events, self.jobs)
        return [base + (1 if k < extra else 0) for k in range(self.jobs)]


def _job_events(job: int, size: int) -> list[Any]:
    from airflow_ett.ett.events import JobSubmitted, Progress

    name, t0 = f"bench-{job}", 1_767_225_600.0 + job * 10_000
    out: list[Any] = [JobSubmitted(id=f"{name}/submit", job=name, ts=t0, tenant="bench",
                                   model="dlrm_small", dag_id="bench")]
    for i in range(size - 1):
        start = t0 + 1 + i * 0.5
        out.append(Progress(id=f"{name}/p{i}", job=name, ts=start + 0.5, attempt="a1",
                            start_ts=start, step_start=i * 8, step_end=(i + 1) * 8,
                            cursor_start=i * 4096, cursor_end=(i + 1) * 4096, loss=0.25))
    return out


def _own_batches(plan: Plan, writer: int) -> list[list[Any]]:
    sizes = plan.job_sizes()
    batches: list[list[Any]] = []
    for job in range(writer, plan.jobs, plan.writers):
        events = _job_events(job, sizes[job])
        batches.extend(events[i:i + plan.batch] for i in range(0, len(events), plan.batch))
    return batches


def _writer_batches(plan: Plan, writer: int) -> list[list[Any]]:
    """Own batches, then a replay of the first REPLAY_SHARE of the next writer's."""
    own = _own_batches(plan, writer)
    other = _own_batches(plan, (writer + 1) % plan.writers)
    replay = other[: max(1, int(len(other) * REPLAY_SHARE))] if other else []
    return own + replay


def _writer(url: str, plan: Plan, writer: int, barrier: Any, results: Any) -> None:
    from airflow_ett.store import EttStore

    try:
        batches = _writer_batches(plan, writer)
        store = EttStore(url)
        store.ping()
        barrier.wait(timeout=300)
        start = time.time()
        new = sum(store.insert_events(batch) for batch in batches)
        results.put((writer, start, time.time(), sum(map(len, batches)), new))
        store.close()
    except BaseException as exc:
        results.put((writer, repr(exc)))
        raise


@dataclass(frozen=True)
class Row:
    backend: str
    writers: int
    sent: int
    distinct: int
    stored: int
    new: int
    version_sum: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.stored == self.distinct == self.new == self.version_sum


def run_one(backend: str, url: str, plan: Plan) -> Row:
    from sqlalchemy import func, select

    from airflow_ett.store import EttStore, upgrade
    from airflow_ett.store.schema import jobs

    upgrade(url)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(plan.writers), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, plan, w, barrier, results))
             for w in range(plan.writers)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    failed = [o for o in outcomes if len(o) == 2]
    if failed:
        raise SystemExit(f"{backend}: writer failed: {failed}")
    start = min(o[1] for o in outcomes)
    end = max(o[2] for o in outcomes)
    with EttStore(url) as store:
        stored = store.count_events()
        with store.engine.connect() as conn:
            version_sum = int(conn.scalar(select(func.sum(jobs.c.version))) or 0)
    return Row(backend, plan.writers, sum(o[3] for o in outcomes), plan.events, stored,
               sum(o[4] for o in outcomes), version_sum, end - start)


@contextmanager
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ett-bench-") as tmp:
        yield f"sqlite:///{Path(tmp) / 'ett.db'}"


@contextmanager
def postgres_url(dsn: str) -> Iterator[str]:
    import psycopg2

    admin = psycopg2.connect(f"{dsn} dbname=postgres connect_timeout=5")
    admin.autocommit = True
    params = admin.get_dsn_parameters()
    name = f"ett_bench_{secrets.token_hex(4)}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg2://{params['user']}@{params['host']}:{params['port']}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000,
                        help="distinct events in all (default 200000)")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--writers", default="1,4",
                        help="comma-separated writer-process counts to run (default 1,4)")
    parser.add_argument("--batch", type=int, default=500, help="events per insert call")
    parser.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 user=postgres",
                        help="libpq DSN of the PostgreSQL server (admin user)")
    args = parser.parse_args(argv)

    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    rows: list[Row] = []
    for backend in backends:
        for writers in (int(w) for w in args.writers.split(",")):
            plan = Plan(args.events, writers, args.batch)
            opener = sqlite_url() if backend == "sqlite" else postgres_url(args.pg_dsn)
            with opener as url:
                rows.append(run_one(backend, url, plan))
            print(f"  done: {backend} x{writers}", file=sys.stderr, flush=True)

    print(f"ETT store ingest: {args.events} distinct events, batches of {args.batch}, "
          f"{int(REPLAY_SHARE * 100)}% of another writer's batches replayed per writer")
    print(f"{'backend':<9} {'writers':>7} {'sent':>8} {'stored':>8} {'lost':>5} {'dup':>4} "
          f"{'seconds':>8} {'stored/s':>9} {'sent/s':>9}  ok")
    for r in rows:
        print(f"{r.backend:<9} {r.writers:>7} {r.sent:>8} {r.stored:>8} "
              f"{r.distinct - r.stored:>5} {r.new - r.stored:>4} {r.seconds:>8.2f} "
              f"{r.stored / r.seconds:>9.0f} {r.sent / r.seconds:>9.0f}  "
              f"{'yes' if r.ok else 'NO'}")
    by_key = {(r.backend, r.writers): r for r in rows}
    for backend in backends:
        one, four = by_key.get((backend, 1)), by_key.get((backend, 4))
        if one and four:
            print(f"{backend}: 4 writers / 1 writer throughput = "
                  f"{(four.stored / four.seconds) / (one.stored / one.seconds):.2f}x")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
