"""Nightly rollup of one day of a synthetic fleet: seconds, peak memory, growth, on SQLite
and PostgreSQL (issue 10: under 30 s for a 20,000-job day, about 2M events; linear growth
from 2k to 20k jobs).

    python bench/rollup.py                                   # 2k and 20k jobs/day, both
    python bench/rollup.py --jobs 2000 --backends sqlite

Each size fills a fresh store with two days of `airflow-ett fleet simulate` (the same
seed), then rolls up the first day, each way in a fresh process (peak RSS is that
process's own), in one run so that the ratios compare like with like:

- baseline: read every job in the store and attribute it whole (a report over all jobs);
- stock: the jobs touching the day, each read with the store's per-job call
  (`EttStore.job_events`, one query per job), as a user of the store API would;
- ours: `EttStore.daily.compute_day` (the jobs touching the day, read in chunks of ids,
  decoded by `decode_stored`, rolled up and stored; what the nightly DAG runs), then the
  day's alerts judged against its stored baseline days (`rollup.alerts.day_alerts`).

Every way computes the slow-step figures too (each job's slow steps, allotted to the day
by its effective time: decision 0035); the fleet's GPU-hours lost to slow steps must be
the same every way, and are printed after the table. No simulated job has a slow step
(every span of a synthetic job runs at its step time), so on SQLite the cut of each job
into the second day (`job_day`, where the first day's late jobs run on) is also timed
with every job's slow steps set to a tenth of its effective time: the allotment's own
cost.

On PostgreSQL the tables are ANALYZEd after the fill, as autovacuum would do soon after a
bulk load (without statistics the planner reads every event for each chunk of ids).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.store_ingest import postgres_url, sqlite_url

DAY = dt.date(2026, 11, 2)
SEED = 7

_MEASURE = r'''
import json, resource, sys, time
from airflow_ett.rollup import day_window, job_day, load_components, rollup_day
from airflow_ett.store import EttStore
from airflow_ett.ett.attribution import attribute_job
import datetime as dt

url, how, day = sys.argv[1], sys.argv[2], dt.date.fromisoformat(sys.argv[3])
window = day_window(day, "UTC")
now = window.hi + 2 * 86400
store = EttStore(url)
start = time.perf_counter()
if how == "ours":
    from airflow_ett.rollup.alerts import day_alerts
    components = load_components()
    rollup = store.daily.compute_day(window, components, now=now)
    jobs_read = len(store.daily.jobs_touching(window.lo, window.hi))
    # and what the nightly task does next: judge the day against its stored baseline
    baseline = store.daily.days((day - dt.timedelta(days=7)).isoformat(),
                                (day - dt.timedelta(days=1)).isoformat())
    alerts = day_alerts(rollup, baseline, components, fleet_url="http://af/ett/")
else:
    if how == "baseline":
        from sqlalchemy import select
        from airflow_ett.store.schema import jobs
        with store.engine.connect() as conn:
            ids = list(conn.scalars(select(jobs.c.job).order_by(jobs.c.job)))
    else:
        ids = store.daily.jobs_touching(window.lo, window.hi)
    parts = [job_day(a, window, gpus=a.world_size, synthetic=a.synthetic)
             for a in (attribute_job(store.job_events(j), now=now) for j in ids)]
    rollup = rollup_day(window, [p for p in parts if p is not None], load_components(),
                        computed_at=now)
    jobs_read = len(ids)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "jobs_read": jobs_read, "jobs": rollup.fleet.jobs,
                  "ett_pct": rollup.fleet.ett_pct, "gpu_hours": rollup.fleet.gpu_hours,
                  "slow_gpu_hours": rollup.fleet.gpu_hours_lost_to_slow_steps,
                  "slow_pct": rollup.fleet.slow_steps_pct_of_effective,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''

# The cut of each job into the day (`job_day`) alone, as simulated (no simulated job has a
# slow step: every span of a synthetic job runs at its step time) and with every job's
# slow steps set to a tenth of its effective time, so the allotment by effective time
# (a job begun before the day sums its effective time before it) is timed too.
_CUT = r'''
import dataclasses, json, sys, time
import datetime as dt
from airflow_ett.ett.attribution.slow_steps import SlowSteps
from airflow_ett.rollup import day_window, job_day
from airflow_ett.store import EttStore

url, day = sys.argv[1], dt.date.fromisoformat(sys.argv[2])
window = day_window(day, "UTC")
store = EttStore(url)
plain = list(store.daily.attributions(window.lo, window.hi, now=window.hi + 2 * 86400))
slow = [dataclasses.replace(a, slow_steps=SlowSteps(
    ideal_step_us=1.0, effective_steps=1.0, steady_steps=1.0, spans=1, slow_spans=1,
    lost_us=a.effective_us // 10, effective_us=a.effective_us)) for a in plain]


def best(attributions):
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for a in attributions:
            job_day(a, window, gpus=a.world_size)
        times.append(time.perf_counter() - start)
    return min(times) * 1000


print(json.dumps({"jobs": len(plain), "before_day": sum(a.submitted_at < window.lo
                                                        for a in plain),
                  "cut_ms": best(plain), "cut_slow_ms": best(slow)}))
'''


def _cli() -> str:
    return str(Path(sys.executable).with_name("airflow-ett"))


def fill(url: str, jobs_per_day: int) -> tuple[int, float]:
    subprocess.run([_cli(), "db", "upgrade", "--store-url", url], check=True,
                   capture_output=True)
    start = time.perf_counter()
    done = subprocess.run([_cli(), "fleet", "simulate", "--days", "2", "--jobs-per-day",
                           str(jobs_per_day), "--seed", str(SEED), "--start", DAY.isoformat(),
                           "--tz", "UTC", "--store-url", url],
                          check=True, capture_output=True, text=True)
    from airflow_ett.store import EttStore

    with EttStore(url) as store:
        events = store.count_events()
        if url.startswith("postgresql"):
            # What autovacuum does within a minute of a bulk load: without table statistics
            # the planner reads all events for every chunk of job ids (a seq scan).
            with store.engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE ett_events")
                conn.exec_driver_sql("ANALYZE ett_jobs")
    del done
    return events, time.perf_counter() - start


def measure(url: str, how: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _MEASURE, url, how, DAY.isoformat()],
                         check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cut_cost(url: str) -> dict[str, float]:
    """On the second simulated day, where the first day's late jobs run on."""
    second = DAY + dt.timedelta(days=1)
    out = subprocess.run([sys.executable, "-c", _CUT, url, second.isoformat()],
                         check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="2000,20000", help="jobs per day, comma-separated")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 user=postgres")
    parser.add_argument("--skip-baseline-above", type=int, default=5000,
                        help="run the whole-store baseline only up to this many jobs/day")
    args = parser.parse_args()
    sizes = [int(x) for x in args.jobs.split(",")]
    print(f"# rollup of one day, {dt.datetime.now(dt.UTC):%Y-%m-%d}, {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; store: 2 simulated "
          f"days (seed {SEED}), the first rolled up")
    print(f"{'backend':<9}{'jobs/day':>9}{'events':>10}{'way':>10}{'jobs read':>10}"
          f"{'seconds':>9}{'peak MB':>9}{'vs ours':>9}")
    slow: list[str] = []
    for backend in args.backends.split(","):
        ours_by_size: dict[int, float] = {}
        for size in sizes:
            ctx = sqlite_url() if backend == "sqlite" else postgres_url(args.pg_dsn)
            with ctx as url:
                events, _ = fill(url, size)
                ways = ["ours", "stock"] + (["baseline"] if size <= args.skip_baseline_above
                                            else [])
                results = {how: measure(url, how) for how in ways}
                if backend == "sqlite":  # pure work: the same on either database
                    cut = cut_cost(url)
                    slow.append(f"job_day of the 2nd day, {cut['jobs']:.0f} jobs "
                                f"({cut['before_day']:.0f} begun before the day): "
                                f"{cut['cut_ms']:.0f} ms as "
                                f"simulated, {cut['cut_slow_ms']:.0f} ms with slow steps "
                                "in every job")
            ours = results["ours"]
            ours_by_size[size] = ours["seconds"]
            for how, r in results.items():
                assert r["jobs"] == ours["jobs"] and abs(r["ett_pct"] - ours["ett_pct"]) < 1e-9
                assert abs(r["slow_gpu_hours"] - ours["slow_gpu_hours"]) < 1e-9, (how, r)
                print(f"{backend:<9}{size:>9}{events:>10}{how:>10}{r['jobs_read']:>10.0f}"
                      f"{r['seconds']:>9.2f}{r['rss_mb']:>9.0f}"
                      f"{r['seconds'] / ours['seconds']:>8.2f}x")
            slow.append(f"{backend} {size}: slow steps {ours['slow_gpu_hours']:,.2f} GPU-h "
                        f"lost inside effective training, {ours['slow_pct']:.2f}% of it")
        if len(sizes) > 1:
            lo, hi = min(sizes), max(sizes)
            print(f"{backend}: growth {lo} -> {hi} jobs/day: time x"
                  f"{ours_by_size[hi] / ours_by_size[lo]:.1f} for jobs x{hi / lo:.0f} "
                  f"(linear: x{hi / lo:.0f})")
    for line in slow:
        print(line)


if __name__ == "__main__":
    main()
