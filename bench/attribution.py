"""Attribution throughput: events per second on one core, from 10k to 1M events.

    python bench/attribution.py [--max-events 1000000] [--repeat 3]

The log is a simulated job (one progress event per step, a checkpoint every 1000 steps,
three failures with replay), the shape a real trainer sends. Parsing JSON is measured
apart from attribution, since the store hands the model parsed events. Target (issue 2):
attribution over 500k events/s at 1M events, growing about linearly.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import UTC, datetime

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import event_to_json, parse_line
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate


def job_events(steps: int) -> list[object]:
    spec = JobSpec(
        job=f"bench-{steps}", steps=steps, progress_every=1, step_s=0.02,
        checkpoint_every=1000,
        failures=tuple(InjectedFailure(at_step=int(steps * f)) for f in (0.1, 0.4, 0.8)),
    )
    return list(simulate(spec))


def best_of(repeat: int, fn: object) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    print(f"# attribution throughput, {datetime.now(UTC):%Y-%m-%d}, {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, pinned to one core")
    print(f"{'events':>10} {'attribute s':>12} {'events/s':>12} {'parse events/s':>15}")
    sizes = [n for n in (10_000, 100_000, 1_000_000) if n <= args.max_events]
    rates = []
    for size in sizes:
        events = job_events(size)
        seconds = best_of(args.repeat, lambda ev=events: attribute_job(ev))  # type: ignore[misc]
        lines = [event_to_json(e) for e in events[:100_000]]  # type: ignore[arg-type]
        parse_s = best_of(1, lambda ls=lines: [parse_line(x) for x in ls])  # type: ignore[misc]
        rates.append(len(events) / seconds)
        print(f"{len(events):>10} {seconds:>12.3f} {len(events) / seconds:>12,.0f} "
              f"{len(lines) / parse_s:>15,.0f}")
    if len(rates) > 1:
        print(f"throughput at the largest size / smallest: {rates[-1] / rates[0]:.2f} "
              "(1.0 = perfectly linear)")
    print(f"median rate {statistics.median(rates):,.0f} events/s; target > 500,000 at 1M")


if __name__ == "__main__":
    main()
