"""Peak memory and time of `compute` and `ingest` on a large events file: streamed, against
the whole file held in memory.

    python -m bench.events_stream [--lines 1000000]

The file is the demo job's events (tests' EXAMPLE_SPEC: 194 events) repeated under new
job ids up to `--lines` lines. Each side runs in a fresh process, whose peak resident set
(`ru_maxrss`) and wall time are printed:

  baseline  the stock way a script would do it, and what both commands did before issue
            22: every line parsed into one list (`airflow_ett.ett.events.read_events`),
            then `attribute(events)` for compute, `store.ingest(events)` for ingest.
  ours      `airflow-ett compute FILE --json` and `airflow-ett ingest FILE` as shipped:
            events streamed, stored in batches, attributed one job at a time from byte
            offsets.

Target (issue 22): under 300 MB at any size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from airflow_ett.ett.events import event_to_json
from airflow_ett.ett.synthetic import EXAMPLE_SPEC, iter_simulate


def write_events_file(path: Path, lines: int) -> int:
    """`lines` lines of events (whole jobs, the last one cut short) at `path`; the number
    of jobs."""
    written = jobs = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < lines:
            jobs += 1
            spec = dataclasses.replace(EXAMPLE_SPEC, job=f"job-{jobs:07d}",
                                       run_id=f"manual__{jobs:07d}")
            for event in iter_simulate(spec):
                fh.write(event_to_json(event) + "\n")
                written += 1
                if written == lines:
                    break
    return jobs


_RUN = """
import json, os, resource, sys, time
start = time.perf_counter()
side, command, path, url = sys.argv[1:5]
if side == "ours":
    from airflow_ett.cli import main
    sys.stdout = open(os.devnull, "w")
    argv = [command, path, "--json"] if command == "compute" else [command, path,
                                                                   "--store-url", url]
    code = main(argv)
else:
    from airflow_ett.ett.events import read_events
    events = read_events(path).events
    if command == "compute":
        from airflow_ett.ett.attribution import attribute
        json.dumps([r.to_dict() for r in attribute(events).values()])
    else:
        from airflow_ett.store import EttStore, upgrade
        upgrade(url)
        with EttStore(url) as store:
            store.ingest(events)
    code = 0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"code": code, "peak_mb": peak / 1024, "s": time.perf_counter() - start}),
      file=sys.stderr)
"""


def measure(side: str, command: str, path: Path, url: str) -> dict[str, float]:
    """Peak RSS (MB) and wall seconds of one side in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _RUN, side, command, str(path), url],
                          capture_output=True, text=True, check=False, timeout=3600)
    result: dict[str, float] = json.loads(done.stderr.strip().splitlines()[-1])
    if result.get("code") != 0:
        raise SystemExit(f"{side} {command} failed: {done.stderr[-2000:]}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ett-bench-events-") as tmp:
        path = Path(tmp) / "events.jsonl"
        jobs = write_events_file(path, args.lines)
        size_mb = path.stat().st_size / 1e6
        print(f"events_stream: {args.lines:,} lines, {size_mb:.0f} MB, {jobs:,} jobs; "
              f"{platform.processor() or platform.machine()}, Python "
              f"{platform.python_version()}, {datetime.now(UTC):%Y-%m-%d}")
        print(f"{'command':<9}{'baseline MB':>13}{'ours MB':>10}{'ratio':>8}"
              f"{'baseline s':>12}{'ours s':>9}{'ratio':>8}")
        for command in ("compute", "ingest"):
            urls = {side: f"sqlite:///{tmp}/{side}-{command}.db" for side in ("base", "ours")}
            if command == "ingest":
                subprocess.run([sys.executable, "-m", "airflow_ett.cli", "db", "upgrade",
                                "--store-url", urls["ours"]], check=True,
                               capture_output=True)
            base = measure("baseline", command, path, urls["base"])
            ours = measure("ours", command, path, urls["ours"])
            print(f"{command:<9}{base['peak_mb']:>13.0f}{ours['peak_mb']:>10.0f}"
                  f"{ours['peak_mb'] / base['peak_mb']:>7.2f}x{base['s']:>12.1f}"
                  f"{ours['s']:>9.1f}{ours['s'] / base['s']:>7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
