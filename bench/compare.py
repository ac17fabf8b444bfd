"""A regression explained: `airflow-ett report --compare` of two 7-day windows from stored
days (issue 26, point 2: under 2 s).

    python bench/compare.py                                  # 20,000 jobs/day, both backends
    python bench/compare.py --jobs 2000,20000 --backends sqlite

Each size fills a fresh store with 14 days of a synthetic fleet, stored as the nightly
rollup stores them (`DailyRollups.replace`: the day, its parts per DAG, tenant and model,
and one row per job-day), from job-days drawn directly (seeded; attributing millions of
events is bench/rollup.py's subject, not this one's). The fleet: `--dags` DAGs of one
model each in 12 tenants, 1-64 GPUs; in the second week 5% of the models left, 5% entered,
3% moved to twice the GPUs and one tenant's compilation got worse. Then, each way in its
own process (`--reps` runs each, the median), in one run so the ratios compare like with
like:

- baseline: the two windows' stored days (`DailyRollups.days`) and their pooled fleet
  ETT%: what `report --from --to` reads, with no split (the floor: the day rows alone);
- stock: the comparison made from the job rows (`DailyRollups.job_days`, every job-day
  of the 14 days, then `day_parts` and `compare`): what it costs without stored parts;
- ours: `report --compare`'s own path (`DailyRollups.window_parts` per window, `compare`,
  the text rendered); and the whole command as a user runs it (`airflow-ett report
  --compare A B --format json`, a fresh interpreter: start-up and imports included).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.store_ingest import postgres_url, sqlite_url

FIRST = dt.date(2026, 11, 2)
SEED = 26
TARGET_S = 2.0
WINDOWS = (f"{FIRST}..{FIRST + dt.timedelta(days=6)}",
           f"{FIRST + dt.timedelta(days=7)}..{FIRST + dt.timedelta(days=13)}")

_MEASURE = r'''
import datetime as dt, json, sys, time
url, how, a, b = sys.argv[1:5]
start = time.perf_counter()
from airflow_ett.rollup.compare import Span, WindowParts, compare, sums_of
from airflow_ett.rollup import day_parts
from airflow_ett.store import EttStore
imported = time.perf_counter() - start

def span(text):
    first, last = text.split("..")
    days = (dt.date.fromisoformat(last) - dt.date.fromisoformat(first)).days + 1
    return Span(first=first, last=last, days=days)

store = EttStore(url)
store.daily.last_day()  # connect before the clock starts
start = time.perf_counter()
spans = [span(a), span(b)]
if how == "baseline":
    pooled = []
    for s in spans:
        days = store.daily.days(s.first, s.last)
        gpu = sum(d.fleet.gpu_hours for d in days)
        pooled.append(100.0 * (gpu - sum(d.fleet.gpu_hours_lost for d in days)) / gpu)
    change = pooled[1] - pooled[0]
    read = sum(s.days for s in spans)
else:
    windows = []
    read = 0
    for s in spans:
        if how == "ours":
            parts = [p for ps in store.daily.window_parts(s.first, s.last).values() for p in ps]
        else:
            parts = []
            for i in range(s.days):
                day = (dt.date.fromisoformat(s.first) + dt.timedelta(days=i)).isoformat()
                job_days = store.daily.job_days(day)
                read += len(job_days)
                parts += [sums_of(p) for p in day_parts(job_days, cut_pct=50.0,
                                                        start_s=60.0)]
        if how == "ours":
            read += len(parts)
        windows.append(WindowParts(span=s, parts=parts))
    result = compare(*windows)
    if how == "ours":
        from airflow_ett.report.compare import compare_text
        compare_text(result)
    change = result.fleet.change_points
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "imports_s": imported, "read": read, "change": change}))
'''


def _cli() -> str:
    return str(Path(sys.executable).with_name("airflow-ett"))


def _job_days(day: dt.date, jobs: int, dags: int, rng: random.Random) -> list[object]:
    from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
    from airflow_ett.rollup import JobDay

    second = day >= FIRST + dt.timedelta(days=7)
    out = []
    for i in range(jobs):
        d = rng.randrange(dags)
        if (second and d < dags // 20) or (not second and d >= dags - dags // 20):
            d = (d + dags // 2) % dags  # week 2: the first 5% left; the last 5% entered
        tenant = f"tenant_{d % 12:02d}"
        gpus = (1, 2, 4, 8, 16, 32, 64)[d % 7]
        if second and dags // 20 <= d < dags // 20 + dags * 3 // 100:
            gpus *= 2  # moved to twice the GPUs
        e2e = rng.randrange(600, 86_400) * 1_000_000
        lost = {c: int(e2e * rng.uniform(0.0, 0.04)) for c in COMPONENTS if c != EFFECTIVE}
        if second and tenant == "tenant_03":
            lost["compilation"] *= 3
        us = {**lost, EFFECTIVE: e2e - sum(lost.values())}
        out.append(JobDay(job=f"{day}-{i}", tenant=tenant, model=f"model_{d:04d}",
                          dag_id=f"dag_{d:04d}", run_id=f"r{i}", gpus=gpus, provisional=False,
                          synthetic=True, e2e_us=e2e, components_us={c: us[c] for c in COMPONENTS},
                          tts_us=rng.randrange(60, 3600) * 1_000_000, failures=(), attempts=1,
                          preempted_attempts=0))
    return out


def fill(url: str, jobs: int, dags: int) -> float:
    from airflow_ett.rollup import day_parts, day_window, load_components, rollup_of_parts
    from airflow_ett.store import EttStore

    subprocess.run([_cli(), "db", "upgrade", "--store-url", url], check=True,
                   capture_output=True)
    start = time.perf_counter()
    rng, components = random.Random(SEED), load_components()
    with EttStore(url) as store:
        for i in range(14):
            day = FIRST + dt.timedelta(days=i)
            window = day_window(day, "UTC")
            days = _job_days(day, jobs, dags, rng)
            parts = day_parts(days, cut_pct=50.0, start_s=60.0)  # type: ignore[arg-type]
            store.daily.replace(rollup_of_parts(window, parts, components,
                                                computed_at=window.hi + 60),
                                days, parts)  # type: ignore[arg-type]
        if url.startswith("postgresql"):
            with store.engine.begin() as conn:  # what autovacuum does after a bulk load
                for table in ("ett_daily_days", "ett_daily_groups", "ett_daily_jobs"):
                    conn.exec_driver_sql(f"ANALYZE {table}")
    return time.perf_counter() - start


def measure(url: str, how: str, reps: int) -> dict[str, float]:
    runs = []
    for _ in range(reps):
        if how == "command":
            start = time.perf_counter()
            done = subprocess.run([_cli(), "report", "--compare", *WINDOWS, "--format", "json",
                                   "--store-url", url], check=True, capture_output=True,
                                  text=True)
            seconds = time.perf_counter() - start
            result = json.loads(done.stdout)
            runs.append({"seconds": seconds, "read": float("nan"),
                         "change": result["fleet"]["change_points"]})
            continue
        out = subprocess.run([sys.executable, "-c", _MEASURE, url, how, *WINDOWS], check=True,
                             capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = dict(runs[0])
    best["seconds"] = statistics.median(r["seconds"] for r in runs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="20000", help="jobs per day, comma-separated")
    parser.add_argument("--dags", type=int, default=500, help="DAGs (one model each)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 user=postgres")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    now = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}"
    print(f"# report --compare {WINDOWS[0]} {WINDOWS[1]}, {now} UTC, "
          f"{platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.1f}; {args.dags} DAGs, "
          f"14 stored days (seed {SEED}); median of {args.reps}")
    print(f"{'backend':<9}{'jobs/day':>9}{'way':>10}{'rows read':>10}{'seconds':>9}"
          f"{'vs ours':>9}  change (points)")
    for backend in args.backends.split(","):
        for size in (int(x) for x in args.jobs.split(",")):
            ctx = sqlite_url() if backend == "sqlite" else postgres_url(args.pg_dsn)
            with ctx as url:
                filled = fill(url, size, args.dags)
                results = {how: measure(url, how, args.reps)
                           for how in ("baseline", "stock", "ours", "command")}
            ours = results["ours"]
            for how, r in results.items():
                assert abs(r["change"] - ours["change"]) < 1e-9, (how, r, ours)
                rows = "-" if r["read"] != r["read"] else f"{r['read']:.0f}"
                print(f"{backend:<9}{size:>9}{how:>10}{rows:>10}{r['seconds']:>9.3f}"
                      f"{r['seconds'] / ours['seconds']:>8.2f}x  {r['change']:+.4f}")
            verdict = "met" if results["command"]["seconds"] < TARGET_S else "NOT met"
            print(f"{backend}: filled in {filled:.0f} s; the whole command "
                  f"{results['command']['seconds']:.2f} s: under {TARGET_S:.0f} s {verdict}")


if __name__ == "__main__":
    main()
