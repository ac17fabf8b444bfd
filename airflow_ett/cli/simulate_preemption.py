"""`airflow-ett simulate-preemption --from D1 --to D2`: what each preemption policy would
have done on this fleet's own recorded jobs (the jobs submitted in those days, from the
ETT store), before a platform team turns preemption on.

The same simulation as bench/preemption.py (`airflow_ett/scheduling/fleet_sim.py`, with
the controller's own victim function); the arrivals are the recorded jobs
(`scheduling/recorded.py` says what is taken from each), the tenants and the fleet's GPUs
those of the tenants file in force.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_ett.cli.common import MAX_GPUS, fail, int_in, store_command, store_url
from airflow_ett.cli.rollup import date_arg

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands
    from airflow_ett.scheduling.fleet_sim import Policy, PolicySummary

POLICIES: tuple[Policy, ...] = ("none", "classic", "stage_aware")


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "simulate-preemption", help="replay recorded jobs under each preemption policy",
        description="Replay the jobs submitted from --from to --to (days in [ett] "
                    "rollup_timezone, both included) under no preemption, the classic "
                    "Kueue-like policy and the stage-aware one, on the tenants file's "
                    "fleet, and print GPU-hours lost to preemption, high-priority waits, "
                    "fleet ETT% and preemptions per job for each. Nothing is changed.")
    p.add_argument("--from", dest="first", type=date_arg, required=True, metavar="D1")
    p.add_argument("--to", dest="last", type=date_arg, required=True, metavar="D2")
    p.add_argument("--tenants", metavar="FILE",
                   help="the tenants file (default: [ett] tenants_file)")
    p.add_argument("--capacity", type=int_in(1, MAX_GPUS), metavar="GPUS",
                   help="the fleet's GPUs (default: the file's capacity_gpus, or its quotas)")
    p.add_argument("--high-priority", type=int_in(-(2**31), 2**31 - 1), default=None,
                   metavar="P",
                   help="report the waits of jobs of priority >= P (default: the highest "
                        "tenant priority)")
    p.add_argument("--store-url", help="SQLAlchemy URL (default: [ett] store_url)")
    p.set_defaults(func=simulate_command)


def _tenants(path: str | None) -> object:
    from airflow_ett.scheduling.tenants import (
        TenantsError,
        load_tenants,
        tenants_file_from_settings,
    )

    try:
        chosen = path if path is not None else tenants_file_from_settings()
        if chosen is None:
            fail("simulate-preemption: no tenants file: pass --tenants FILE or set "
                 "[ett] tenants_file")
        return load_tenants(chosen)
    except TenantsError as exc:
        fail(str(exc))


@store_command
def simulate_command(args: argparse.Namespace) -> int:
    from airflow_ett.console import line
    from airflow_ett.rollup import day_window
    from airflow_ett.scheduling.fleet_sim import FleetSimError, simulate, summarise
    from airflow_ett.scheduling.recorded import recorded_arrivals
    from airflow_ett.scheduling.tenants import TenantsConfig
    from airflow_ett.settings import RollupSettings
    from airflow_ett.store import EttStore

    if args.last < args.first:
        fail(f"--to: {args.last.isoformat()} is before --from: {args.first.isoformat()}")
    config = _tenants(args.tenants)
    assert isinstance(config, TenantsConfig)
    capacity = args.capacity or config.fleet_gpus
    tz = RollupSettings.load().timezone
    lo = day_window(args.first, tz).lo
    hi = day_window(args.last + dt.timedelta(days=1), tz).lo
    with EttStore(store_url(args)) as store:
        rows = store.list_runs(since=lo, until=hi, limit=None)
        recorded = recorded_arrivals((store.job_summary(r.job) for r in rows),
                                     config.tenants, capacity)
    # Tenants come from the recorded events: through the console, escaped.
    line(f"{len(recorded.arrivals)} recorded job(s) submitted {args.first} to {args.last} "
         f"({tz}), on {capacity} GPUs, tenants {config.source}")
    if recorded.unknown_tenants:
        left = ", ".join(f"{t} ({n})" for t, n in sorted(recorded.unknown_tenants.items()))
        line(f"left out, tenants not in the file: {left}")
    if recorded.not_started:
        line(f"left out, never trained: {recorded.not_started}")
    if recorded.too_big:
        line(f"left out, more GPUs than their tenant may hold: {recorded.too_big}")
    if not recorded.arrivals:
        fail("simulate-preemption: no recorded job to replay in those days")
    high = args.high_priority if args.high_priority is not None else max(
        t.priority for t in config.tenants.values())
    try:
        summaries = {policy: summarise([simulate(recorded.arrivals, config.tenants, capacity,
                                                 policy, resume_after_s=config.resume_after_s,
                                                 wait_price=config.checkpoint_wait_price)],
                                       high_priority=high)
                     for policy in POLICIES}
    except FleetSimError as exc:
        fail(f"simulate-preemption: {exc}")
    _table(summaries, high)
    sys.stdout.flush()
    return 0


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def _table(summaries: Mapping[Policy, PolicySummary], high: int) -> None:
    from airflow_ett.console import emit, is_terminal, table

    classic = summaries["classic"].lost_to_preemption.total
    rows = []
    for policy, s in summaries.items():
        lost = s.lost_to_preemption
        rows.append((policy, f"{lost.total / 3600:,.1f}", f"{lost.unsaved / 3600:,.1f}",
                     f"{lost.restart / 3600:,.1f}", f"{lost.save / 3600:,.1f}",
                     f"{lost.total / classic:.2f}x" if classic > 0 else "-",
                     _minutes(s.high_wait_p50_s), _minutes(s.high_wait_p90_s),
                     f"{s.ett_pct:.2f}", f"{s.preemptions_per_job:.3f}",
                     f"{s.finished}/{s.jobs}"))
    emit(table(["policy", "lost GPU-h", "unsaved", "restart", "save", "vs classic",
                f"p50 wait min (priority >= {high})", "p90 wait min", "ETT%",
                "preemptions/job", "finished"], rows, terminal=is_terminal()))
