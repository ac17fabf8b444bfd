"""`airflow-ett fleet simulate`: write a SYNTHETIC fleet into the ETT store, so that the
rollup, the reports and the pages can be seen and benchmarked before a real fleet reports.

What the jobs look like is `airflow_ett/rollup/simulate.py`'s (tenants, models, phase
times shaped like the measured demo runs, failures by cause, jobs across midnight). Each
job is written whole, to its end, so none is left running for ever; by default the last
day is the latest whose jobs have all ended by now, so no event lies in the future. It
writes `days x jobs-per-day` jobs, and says so: the progress and the summary count the
same jobs. Synthetic data must never pass for a
measurement: the first line of the output says SYNTHETIC, and every job is marked where
every later reader sees it (`job_submitted.attrs.synthetic`, counted by the rollup as
`synthetic_jobs`; ids `sim-<seed>-...`, DAG ids `sim_...`).

Idempotent: the same arguments make the same events with the same ids, and the store
keeps the first of each id, so a rerun writes nothing new. Events go to the store in
batches of `BATCH_EVENTS` (one transaction each): few enough transactions to be fast on
SQLite, small enough that memory stays flat for any fleet size.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from airflow_ett.cli.common import fail, store_command, store_url, with_store
from airflow_ett.cli.rollup import date_arg, timezone

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands
    from airflow_ett.ett.events import Event
    from airflow_ett.ett.synthetic import JobSpec
    from airflow_ett.store import EttStore

BATCH_EVENTS = 20_000
"""Events per `insert_events` call (one transaction)."""

# fleet_specs' argument names -> the options that give them
_OPTIONS = {"days": "--days", "jobs_per_day": "--jobs-per-day", "seed": "--seed",
            "start_day": "--start", "timezone": "--tz"}


def _bounded_int(lo: int, bound: str) -> Callable[[str], int]:
    """argparse type: a whole number from `lo` to the simulation's bound named `bound`
    (looked up when an option is given, so that `--help` does not load the simulator);
    argparse names the option in its error."""

    def parse(text: str) -> int:
        from airflow_ett.rollup import simulate

        hi: int = getattr(simulate, bound)
        try:
            value = int(text)
        except ValueError:
            value = lo - 1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"must be a whole number in [{lo}, {hi}], got {text!r}")
        return value

    return parse


def add_parser(sub: Subcommands) -> None:
    fleet = sub.add_parser(
        "fleet", help="a synthetic fleet, to try the rollup, reports and pages on").add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION")
    sim = with_store(fleet.add_parser(
        "simulate", help="write a SYNTHETIC fleet of jobs into the store (marked synthetic)",
        description="Write simulated jobs (tenants, models, failures, jobs across midnight; "
                    "shaped like the measured demo runs, scaled to fleet jobs) into the ETT "
                    "store. Every job is marked synthetic (job_submitted attrs "
                    '{"synthetic": true}, ids sim-<seed>-...). The same arguments write the '
                    "same events, so a rerun adds nothing."))
    sim.add_argument("--days", type=_bounded_int(1, "MAX_DAYS"), default=7,
                     help="days of jobs (default: 7)")
    sim.add_argument("--jobs-per-day", type=_bounded_int(1, "MAX_JOBS_PER_DAY"), default=1000,
                     help="jobs submitted each day (default: 1000)")
    sim.add_argument("--seed", type=_bounded_int(0, "MAX_SEED"), default=0,
                     help="random seed: the same seed, days and jobs give the same fleet "
                          "(default: 0)")
    sim.add_argument("--start", type=date_arg,
                     help="first day, YYYY-MM-DD (default: the last day is the latest whose "
                          "jobs, up to 22 h long, have all ended by now)")
    sim.add_argument("--tz", help="time zone of the days (default: [ett] rollup_timezone)")
    sim.set_defaults(func=simulate_command)


@store_command
def simulate_command(args: argparse.Namespace) -> int:
    from airflow_ett.console import terminal_text
    from airflow_ett.rollup.simulate import (
        SimulationError,
        default_start,
        fleet_end,
        fleet_horizon,
        fleet_specs,
    )
    from airflow_ett.settings import RollupSettings
    from airflow_ett.store import EttStore
    from airflow_ett.store import mask_url as _mask_url

    def mask_url(url: str) -> str:  # the one string here not made by this command
        return terminal_text(_mask_url(url))

    tz = timezone(args, RollupSettings.load())
    now = time.time()
    start: dt.date = args.start or default_start(args.days, now, tz)
    try:
        specs = fleet_specs(args.days, args.jobs_per_day, args.seed, start, tz)
    except SimulationError as exc:  # "name: ...": said with the option's name
        name, _, rest = str(exc).partition(":")
        fail(f"{_OPTIONS.get(name, name)}:{rest}")
    last = fleet_horizon(start, args.days, tz).day
    url = store_url(args)
    print(f"airflow-ett: writing a SYNTHETIC fleet (simulated jobs, not measurements): "
          f"{args.days} day(s) {start}..{last} ({tz}), {args.jobs_per_day} jobs/day, "
          f"seed {args.seed}, into {mask_url(url)}", flush=True)
    if fleet_end(start, args.days, tz) > now:
        print(f"airflow-ett: warning: the jobs of {last} run up to 22 h past its end in {tz}, "
              "which is not over yet: some synthetic events lie in the future",
              file=sys.stderr)
    began = time.perf_counter()
    with EttStore(url) as store:
        _refuse_another_fleet(store, args.seed, start, args.days, tz)
        jobs, events, new, conflicts = _write(store, specs, args.days * args.jobs_per_day)
    seconds = max(time.perf_counter() - began, 1e-9)
    print(f"synthetic fleet in the store {mask_url(url)}:\n"
          f"  jobs    {jobs:,} over {args.days} day(s) {start}..{last} ({tz}), each to its "
          "end (the last day's run up to 22 h past it)\n"
          f"  events  {events:,}: {new:,} new, {events - new:,} already there\n"
          f"  speed   {seconds:.1f} s: {jobs / seconds:,.0f} jobs/s, "
          f"{events / seconds:,.0f} events/s\n"
          f"every job is marked synthetic: job_submitted attrs {{\"synthetic\": true}}, "
          f"ids sim-{args.seed}-..., DAG ids sim_...")
    if conflicts:
        print(f"airflow-ett: warning: {conflicts:,} event id(s) were stored before with other "
              "content (the same seed in another time zone, or an older version of the "
              "simulator?): the stored versions stand; use another --seed", file=sys.stderr)
    print(f"next: airflow-ett rollup --from {start} --to {last} --tz {tz}")
    return 0


def _refuse_another_fleet(store: EttStore, seed: int, start: dt.date, days: int,
                          tz: str) -> None:
    """Fail, before anything is written, if the store holds a job of this fleet's ids with
    other content: the same seed simulated in another time zone (or by another version of
    the simulator). Its events would mix with these under one id and make nonsense jobs.
    Job 0 of every day is the probe: any two fleets of one seed that share a day share it."""
    from airflow_ett.rollup.simulate import fleet_job

    for i in range(days):
        spec = fleet_job(seed, start + dt.timedelta(days=i), tz)
        row = store.get_job(spec.job)
        if row is None:
            continue
        if (row.tenant, row.model) != (spec.tenant, spec.model) or row.submitted_ts is None \
                or abs(row.submitted_ts - spec.submit_ts) > 1e-3:
            fail(f"the store already holds synthetic job {spec.job!r} with other content (a "
                 f"fleet of seed {seed} made in another time zone than {tz}, or by another "
                 "version of the simulator): nothing written; use another --seed")


def _write(store: EttStore, specs: Iterable[JobSpec],
           planned: int) -> tuple[int, int, int, int]:
    """Simulate each spec and store its events, a batch at a time, with a progress meter
    over the planned jobs (it counts the jobs written, so it ends where the summary's
    count does); returns (jobs, events, new events, events whose id was stored with other
    content). `ingest` costs nothing more than `insert_events` for new events; on a rerun
    it tells a replay from a clash."""
    from airflow_ett.console import progress
    from airflow_ett.ett.synthetic import iter_simulate

    jobs = events = new = conflicts = shown = 0
    batch: list[Event] = []
    with progress(planned, "synthetic jobs") as advance:
        for spec in specs:
            batch.extend(iter_simulate(spec))
            jobs += 1
            if len(batch) >= BATCH_EVENTS:
                result = store.ingest(batch)
                new, conflicts = new + result.new, conflicts + result.conflicts
                events += len(batch)
                batch = []
                advance(jobs - shown)
                shown = jobs
        if batch:
            result = store.ingest(batch)
            new, conflicts = new + result.new, conflicts + result.conflicts
            events += len(batch)
        advance(jobs - shown)
    return jobs, events, new, conflicts
